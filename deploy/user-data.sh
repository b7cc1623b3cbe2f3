#!/bin/bash
# EC2 / ECS user-data: installs nothing at boot beyond what the image lacks, then starts the runner.
# The bot fills in FINETUNE_SPEC (the spec object it uploaded first) when it launches the instance.
# Expects an image with the runner installed under /opt/finetune (see README) and the unit file in place.
set -euo pipefail
cat > /etc/finetune-runner.env <<ENV
FINETUNE_SPEC=__FINETUNE_SPEC__
FINETUNE_WORK_DIR=/opt/dlami/nvme/finetune
ENV
systemctl daemon-reload
systemctl enable --now finetune-runner.service
