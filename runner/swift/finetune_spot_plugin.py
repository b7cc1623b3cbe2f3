"""ms-swift plugin: registers ``SpotCheckpointCallback`` in swift's ``callbacks_map`` as ``spot_checkpoint``.

The runner puts this file's path in ``${FINETUNE_SWIFT_PLUGIN}``, so a recipe needs no copy of it anywhere::

    python -m swift.cli.sft ... --external_plugins ${FINETUNE_SWIFT_PLUGIN} --callbacks spot_checkpoint

ms-swift 4.x imports an external plugin by path, as a top-level module named after the file (it puts this
directory on ``sys.path``), hence the name that cannot clash with another plugin's ``plugin.py``. It runs in the
training process, which finds ``runner`` through the ``PYTHONPATH`` the runner gives the trainer.
"""

from __future__ import annotations

from swift.callbacks import callbacks_map

from runner.hf.callback import SpotCheckpointCallback

CALLBACK_NAME = "spot_checkpoint"

callbacks_map[CALLBACK_NAME] = SpotCheckpointCallback
