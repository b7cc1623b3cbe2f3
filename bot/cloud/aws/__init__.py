"""AWS: EC2 Spot instances or an Auto Scaling group per job (:mod:`bot.cloud.aws.provider`); botocore's errors are
mapped to the cloud port's family in one place, :mod:`bot.cloud.aws.errors`."""
