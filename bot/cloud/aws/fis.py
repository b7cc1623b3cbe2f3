"""Interrupt tests on AWS: AWS FIS experiments (``aws:ec2:send-spot-instance-interruptions``) that make EC2 itself
interrupt a job's spot instance, with the real two-minute notice."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from bot.cloud.aws.clients import DENIED, AwsClients
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.launching import JOB_TAG, client_token
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from handlers.notes import InterruptTestResult

log = logging.getLogger(__name__)


class AwsFis:
    """One experiment template per job (tagged ``<fis_template_tag>=true``, reused), one experiment per instance."""

    def __init__(self, settings: AwsSettings, clients: AwsClients) -> None:
        self.settings = settings
        self.clients = clients

    def role(self) -> str:
        """The role FIS assumes; CloudError when none is configured (checked before anything is looked up)."""
        role = self.settings.fis_role_arn
        if not role:
            raise CloudError(
                "FIS is not set up: set fis_role_arn to a role FIS may assume (with the "
                "AWSFaultInjectionSimulatorEC2Access policy) to run interrupt tests"
            )
        return role

    async def interrupt(self, instance_id: str, instance: dict[str, Any], job_id: str) -> InterruptTestResult:
        """A real spot interruption of ``instance`` (described, tagged for ``job_id``): an experiment template
        targeting the job's running spot instances by their ``finetune:job`` tag, then a started experiment."""
        role = self.role()
        state = str(instance.get("State", {}).get("Name", ""))
        if state not in ("pending", "running"):
            raise CloudError(f"instance {instance_id} is {state or 'gone'}: nothing to interrupt")
        if instance.get("InstanceLifecycle") != "spot":
            raise CloudError(f"instance {instance_id} is on-demand: FIS interrupts only spot instances")
        fis = await self.clients.get("fis")
        try:
            template_id = await self._interrupt_test_template(fis, job_id, role)
            reply = await fis.start_experiment(
                experimentTemplateId=template_id,
                clientToken=client_token("interrupt-test", instance_id),  # one per instance, however often asked
                tags={JOB_TAG: job_id, "finetune:instance": instance_id},
            )
        except CloudRefused as exc:
            code, message = exc.code, exc.message
            if code in DENIED:
                raise CloudError(
                    f"not permitted: FIS said {code} ({message}); the bot needs fis:CreateExperimentTemplate, "
                    f"fis:StartExperiment, fis:ListExperimentTemplates, fis:TagResource and iam:PassRole on {role}"
                ) from exc
            raise CloudError(f"FIS could not start the interrupt test: {code}: {message}") from exc
        except CloudUnavailable as exc:
            where = self.clients.region or "default region"
            raise CloudUnavailable(f"FIS is not available here ({where}): {exc}") from exc
        experiment_id = str(reply["experiment"]["id"])
        log.info("FIS experiment %s (template %s) started on %s (%s)", experiment_id, template_id, instance_id, job_id)
        lead = self.settings.interrupt_test_notice  # PT<n>M or PT<n>S
        after = int(lead[2:-1]) * (60 if lead.endswith("M") else 1)
        return InterruptTestResult(instance_id=instance_id, way="fis", reference=experiment_id, after_seconds=after)

    async def _interrupt_test_template(self, fis: Any, job_id: str, role: str) -> str:
        marker = self.settings.fis_template_tag
        paginator = fis.get_paginator("list_experiment_templates")
        async for page in paginator.paginate():
            for summary in page.get("experimentTemplates", []):
                tags = summary.get("tags") or {}
                if tags.get(marker) == "true" and tags.get(JOB_TAG) == job_id:
                    return str(summary["id"])
        reply = await fis.create_experiment_template(
            clientToken=uuid.uuid4().hex,
            description=f"finetune-chatops interrupt test: spot interruption of {job_id}",
            roleArn=role,
            stopConditions=[{"source": "none"}],
            targets={
                "SpotInstances": {
                    "resourceType": "aws:ec2:spot-instance",
                    "resourceTags": {JOB_TAG: job_id},
                    "filters": [{"path": "State.Name", "values": ["running"]}],
                    "selectionMode": "ALL",
                }
            },
            actions={
                "interrupt": {
                    "actionId": "aws:ec2:send-spot-instance-interruptions",
                    "parameters": {"durationBeforeInterruption": self.settings.interrupt_test_notice},
                    "targets": {"SpotInstances": "SpotInstances"},
                }
            },
            tags={marker: "true", JOB_TAG: job_id},
        )
        return str(reply["experimentTemplate"]["id"])
