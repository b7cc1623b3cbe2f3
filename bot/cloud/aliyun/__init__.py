"""Alibaba Cloud: preemptible ECS instances or ESS scaling groups (:mod:`bot.cloud.aliyun.provider`); the Tea /
darabonba SDK's errors are mapped to the cloud port's family in one place, :mod:`bot.cloud.aliyun.errors`."""
