"""The ms-swift plugin of the runner image: ``swift sft --external_plugins /opt/finetune/spot_plugin.py
--callbacks spot_checkpoint`` (the ``deepseek-7b`` recipe) makes swift's Trainer spot-safe with the runner's
:class:`~runner.hf.callback.SpotCheckpointCallback` (checkpoint on SIGTERM, the completion marker, progress lines).

deploy/image/install.sh puts it in /opt/finetune, the virtualenv that holds both the runner and ms-swift.
"""

from swift.callbacks.mapping import callbacks_map  # ms-swift 4.x: swift constructs it as cls(args, trainer)

from runner.hf.callback import SpotCheckpointCallback

callbacks_map["spot_checkpoint"] = SpotCheckpointCallback
