# finetune-bot as a service: `make release && docker build -t finetune-bot:0.1.0 .` (the tag is VERSION's; docs/production.md).
# It installs the wheel `make dist` builds, with the bot's extra, into /opt/finetune: the path the runner image uses
# too, so the interpreter a recipe's {python} names exists on both. Linted with hadolint in `make test`.
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY dist/ /tmp/dist/
# One wheel in dist/ (make dist empties it first); its "bot" extra (Slack, DingTalk, Redis, boto3, the Alibaba SDKs)
# comes from the lock make dist puts beside it, every file checked against its hash; then the wheel alone.
RUN python -m venv /opt/finetune \
    && set -- /tmp/dist/finetune_chatops-*-py3-none-any.whl \
    && test "$#" -eq 1 && test -f "$1" \
    && /opt/finetune/bin/pip install --no-compile --require-hashes --no-deps -r /tmp/dist/bot.txt \
    && /opt/finetune/bin/pip install --no-compile --no-deps "$1" \
    && /opt/finetune/bin/python -m compileall -q /opt/finetune/lib

FROM python:3.11-slim-bookworm
COPY --from=build /opt/finetune /opt/finetune
# finetune-train: the user a runner started as root (a local cloud instance of a bot run as root) starts its
# trainer as, so that nothing a chat user chose runs as root.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/finetune --create-home \
        --shell /usr/sbin/nologin finetune \
    && useradd --system --uid 10002 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin finetune-train
# Configuration is by environment (docs/configuration.md); the config file is mounted and named by FINETUNE_CONFIG,
# e.g. -v ./config.yaml:/etc/finetune/config.yaml:ro -e FINETUNE_CONFIG=/etc/finetune/config.yaml.
# FINETUNE_HTTP_HOST: inside a container the bot listens on every interface (the default is 127.0.0.1).
ENV PATH=/opt/finetune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FINETUNE_HTTP_HOST=0.0.0.0 \
    FINETUNE_HTTP_PORT=8080 \
    FINETUNE_STATE_DIR=/var/lib/finetune
USER 10001:10001
WORKDIR /var/lib/finetune
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/finetune/bin/python", "-m", "bot.healthcheck"]
# SIGTERM stops it cleanly: the event in hand is finished or left for the other replica.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/finetune/bin/finetune-bot"]
CMD ["serve"]
