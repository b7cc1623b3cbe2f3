"""The ms-swift integration: ``finetune_spot_plugin.py`` here is what ``--external_plugins`` loads."""
