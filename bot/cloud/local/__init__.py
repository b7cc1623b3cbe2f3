"""The local cloud: an instance is a process on this machine (:mod:`bot.cloud.local.provider`)."""
