#!/usr/bin/env bash
# Install finetune-chatops on a machine image: the runner (the GPU image every job boots) or the bot (a VM that
# runs the bot with systemd). Run as root on the template instance / image build instance:
#
#   bash install.sh runner finetune_chatops-0.1.0-py3-none-any.whl
#   bash install.sh bot    finetune_chatops-0.1.0-py3-none-any.whl
#
# It makes a Python 3.11+ virtualenv at FINETUNE_PREFIX (/opt/finetune) holding the wheel `make dist` builds
# (the runner with the wheel's "trainer" and "swift" extras: torch, transformers, peft, accelerate, ms-swift, whose
# plugin ships inside the runner package; the bot with "bot"), every dependency from the hashed lock make dist puts
# beside the wheel (runner.txt, bot.txt; base.txt for no extras; each pins pip itself too), and puts the systemd
# unit in FINETUNE_SYSTEMD_DIR (/etc/systemd/system). It enables nothing: each instance's boot script
# (bot/cloud/user_data.py) writes /etc/finetune-runner.env and starts finetune-runner.service; the bot's unit is
# started once /etc/finetune/bot.env is written (docs/production.md). Running it again upgrades in place.
#
# The unit files are looked up next to this script, then in ../systemd/ (the repository's layout).
# Variables: FINETUNE_PREFIX; FINETUNE_EXTRAS (the wheel's extras, comma-separated; "" for none);
# FINETUNE_PIP_PACKAGES (more packages, each pinned and hashed like a lock's entries, space-separated:
# "flash-attn==2.8.3 --hash=sha256:<64 hex> einops==0.8.1 --hash=sha256:<64 hex>"; `uv pip compile --generate-hashes`
# or `pip hash` gives them; every dependency they add must be listed too); PIP_INDEX_URL (a mirror,
# e.g. https://mirrors.cloud.aliyuncs.com/pypi/simple/ inside Alibaba Cloud); PYTHON (an interpreter >= 3.11;
# default: the newest python3.x on PATH, else apt-get installs python3.11); FINETUNE_SYSTEMD_DIR;
# FINETUNE_NO_SYSTEMCTL=1 to skip `systemctl daemon-reload` (an image build without a running systemd).
set -euo pipefail

die() { echo "install.sh: $*" >&2; exit 2; }

role=${1:-}
wheel=${2:-}
[[ $role == runner || $role == bot ]] || die "usage: install.sh runner|bot WHEEL"
[[ -f $wheel ]] || die "no wheel at '${wheel}': build it with make dist"
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${FINETUNE_PREFIX:-/opt/finetune}
systemd_dir=${FINETUNE_SYSTEMD_DIR:-/etc/systemd/system}
if [[ $role == runner ]]; then extras=${FINETUNE_EXTRAS-trainer,swift}; else extras=${FINETUNE_EXTRAS-bot}; fi
[[ $prefix =~ ^/[A-Za-z0-9._/-]+$ ]] || die "FINETUNE_PREFIX must be an absolute path of letters, digits and . _ / -"
[[ $extras =~ ^[a-z,]*$ ]] || die "FINETUNE_EXTRAS must be extra names separated by commas"
# The wheel's dependencies come from the lock make dist puts beside it, every file checked against its hash; then
# the wheel itself. Each set of extras has its lock: none (the runner agent alone), the runner image's, the bot's.
case $extras in
    "") lock=base.txt ;;
    trainer,swift) lock=runner.txt ;;
    bot) lock=bot.txt ;;
    *) die "no lock for the extras '${extras}': make dist locks '', 'trainer,swift' and 'bot' (make lock makes them)" ;;
esac
lock=$(dirname "$wheel")/$lock
[[ -f $lock ]] || die "no lock at '${lock}': make dist puts it beside the wheel; copy it along"

# FINETUNE_PIP_PACKAGES, checked before anything is installed: name==version entries, each followed by at least one
# --hash=sha256:<64 hex> (pip's hashed requirements format, one requirement a line once written out). They go into
# the same environment as the runner, because the trainer runs there too (a recipe's {python} is this prefix's
# interpreter): what a trainer imports must be beside torch and ms-swift. So they are held to the lock's standard:
# a pinned version, and every file pip takes checked against a hash named here (--require-hashes; a dependency
# they pull in that is neither installed already nor listed is refused, not fetched).
extra_requirements=()
if [[ -n ${FINETUNE_PIP_PACKAGES:-} ]]; then
    read -r -a words <<< "$FINETUNE_PIP_PACKAGES"
    for word in "${words[@]}"; do
        if [[ $word =~ ^--hash=sha256:[0-9a-f]{64}$ ]]; then
            (( ${#extra_requirements[@]} )) || die "FINETUNE_PIP_PACKAGES: '${word}' comes before any name==version"
            extra_requirements[-1]+=" $word"
        elif [[ $word =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*$ ]]; then
            extra_requirements+=("$word")
        else
            die "FINETUNE_PIP_PACKAGES: '${word}' is neither name==version nor --hash=sha256:<64 hex digits>"
        fi
    done
    for requirement in "${extra_requirements[@]}"; do
        [[ $requirement == *" --hash="* ]] || die "FINETUNE_PIP_PACKAGES: '${requirement}' has no --hash=sha256:..."
    done
fi

find_unit() {
    local name=$1
    for candidate in "$here/$name" "$here/../systemd/$name"; do
        if [[ -f $candidate ]]; then echo "$candidate"; return 0; fi
    done
    die "$name is neither next to install.sh nor in ../systemd/"
}
unit_name=finetune-$role.service
unit=$(find_unit "$unit_name")

python_ok() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
python=${PYTHON:-}
if [[ -z $python ]]; then
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null && python_ok "$candidate"; then python=$candidate; break; fi
    done
fi
if [[ -z $python ]] && command -v apt-get >/dev/null; then
    echo "install.sh: no Python 3.11+ here; installing python3.11 with apt-get"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv
    python=python3.11
fi
if [[ -z $python ]] || ! python_ok "$python"; then
    die "need Python 3.11 or newer (set PYTHON=/path/to/python3.11)"
fi

echo "install.sh: $role into $prefix with $($python --version)"
if [[ ! -x $prefix/bin/python ]]; then
    "$python" -m venv "$prefix"
fi
# The lock pins pip too (requirements/pip.in): the virtualenv's own pip installs it, by hash, with the rest, and
# every install after this one runs that pip. Nothing is upgraded to whatever the index has today.
"$prefix/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$lock"
"$prefix/bin/python" -m pip install --quiet --no-deps --force-reinstall "$wheel"  # a rebuilt wheel of the same version too
if (( ${#extra_requirements[@]} )); then
    extra_lock=$(mktemp)
    trap 'rm -f "$extra_lock"' EXIT
    printf '%s\n' "${extra_requirements[@]}" > "$extra_lock"
    "$prefix/bin/python" -m pip install --quiet --require-hashes -r "$extra_lock"
fi

mkdir -p "$systemd_dir"
# The units name /opt/finetune; another prefix is written into the installed copy.
sed "s#/opt/finetune#${prefix}#g" "$unit" > "$systemd_dir/$unit_name.tmp"
chmod 0644 "$systemd_dir/$unit_name.tmp"
mv "$systemd_dir/$unit_name.tmp" "$systemd_dir/$unit_name"

# The runner (root) starts each trainer as this user: what a chat user chose to train never runs as root.
if [[ $role == runner && $(id -u) == 0 ]]; then
    id finetune-train >/dev/null 2>&1 || useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin finetune-train
    # Nothing of the trainer's may outlive its process tree (runner/trainer_box.py sweeps that tree before every
    # start): no cron or at jobs for its user.
    for deny in /etc/cron.deny /etc/at.deny; do
        grep -qx finetune-train "$deny" 2>/dev/null || echo finetune-train >> "$deny"
    done
    # The runner keeps that user from the metadata service with iptables (runner/metadata_guard.py); without it
    # the runner starts no trainer (exit code 4).
    command -v iptables >/dev/null || echo "install.sh: WARNING: no iptables here: install it, or the runner will" \
        "refuse to start trainers (FINETUNE_METADATA_GUARD=required)" >&2
fi
if [[ $role == bot && $(id -u) == 0 ]]; then
    id finetune >/dev/null 2>&1 || useradd --system --user-group --home-dir /var/lib/finetune --shell /usr/sbin/nologin finetune
    install -d -m 0750 -o root -g finetune /etc/finetune
fi

if [[ -z ${FINETUNE_NO_SYSTEMCTL:-} && -d /run/systemd/system ]]; then
    systemctl daemon-reload
fi
"$prefix/bin/finetune-$role" --help >/dev/null
echo "install.sh: installed $prefix/bin/finetune-$role and $systemd_dir/$unit_name"
