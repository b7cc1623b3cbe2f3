"""Alibaba Cloud ECS event payloads in the shapes Alibaba documents, for the parser and the HTTP intake tests.

- ``notification``: the CloudMonitor event notification format ("Overview of event notifications"): ``ver``, ``id``,
  ``eventTime`` in basic ISO 8601 at UTC+8, ``resourceId`` as an ACS resource name, ``content``;
- ``subscription``: what a CloudMonitor event subscription pushes (and its "debug event subscription" sends):
  ``status`` and ``instanceName``, no ``id``, no time;
- ``system_event_content``: a scheduled O&M event's content (``Instance:SystemMaintenance.Reboot:Scheduled``);
- ``cloudevent``: an EventBridge CloudEvent 1.0 from the system bus (``source: acs.ecs``, ``type: ecs:<name>``, the
  ``aliyun*`` extension attributes), ``data`` being the event's content.
"""

from __future__ import annotations

from typing import Any

ACCOUNT = "1690700000000030"
REGION = "cn-hangzhou"
INTERRUPTION = "Instance:PreemptibleInstanceInterruption"
STATE_CHANGE = "Instance:StateChange"


def resource(instance_id: str) -> str:
    return f"acs:ecs:{REGION}:{ACCOUNT}:instance/{instance_id}"


def interruption_content(instance_id: str) -> dict[str, Any]:
    return {"instanceId": instance_id, "action": "delete"}


def state_content(instance_id: str, state: str) -> dict[str, Any]:
    return {"resourceId": instance_id, "resourceType": "ALIYUN::ECS::Instance", "state": state}


def system_event_content(
    instance_id: str,
    event_type: str = "SystemMaintenance.Reboot",
    status: str = "Scheduled",
    *,
    event_id: str = "e-bp11trd0000000pqum2",
    not_before: str = "2019-04-12T01:01:01Z",
) -> dict[str, Any]:
    """A scheduled O&M event's content, as "ECS event notifications" shows it for ``SystemMaintenance.Reboot``."""
    return {
        "eventId": event_id,
        "publishTime": "2019-04-09T04:18:26Z",
        "notBefore": not_before,
        "instanceId": instance_id,
        "eventType": event_type,
        "eventStatus": status,
    }


def notification(
    name: str,
    content: dict[str, Any],
    instance_id: str,
    *,
    event_id: str = "2256A988-0B26-4E2B-820A-8A0000000AE5",
    event_time: str = "20190409T121826.922+0800",
    level: str = "WARN",
) -> dict[str, Any]:
    return {
        "ver": "1.0",
        "id": event_id,
        "product": "ECS",
        "resourceId": resource(instance_id),
        "level": level,
        "name": name,
        "userId": ACCOUNT,
        "eventTime": event_time,
        "regionId": REGION,
        "content": content,
    }


def subscription(name: str, content: dict[str, Any], instance_id: str) -> dict[str, Any]:
    return {
        "product": "ECS",
        "resourceId": resource(instance_id),
        "level": "WARN" if name == INTERRUPTION else "INFO",
        "instanceName": "finetune-ft-abc1-1",
        "regionId": REGION,
        "groupId": "0",
        "name": name,
        "content": content,
        "status": "Normal",
    }


def cloudevent(
    name: str,
    data: dict[str, Any] | str,
    instance_id: str,
    *,
    event_id: str = "45ef4dewdwe1-7c35-447a-bd93-fab****",
    time: str = "2019-04-09T04:18:26.922Z",
) -> dict[str, Any]:
    return {
        "id": event_id,
        "source": "acs.ecs",
        "specversion": "1.0",
        "type": f"ecs:{name}",
        "datacontenttype": "application/json; charset=utf-8",
        "subject": resource(instance_id),
        "time": time,
        "aliyunaccountid": ACCOUNT,
        "aliyunpublishtime": "2019-04-09T04:18:27.104Z",
        "aliyuneventbusname": "default",
        "aliyunregionid": REGION,
        "aliyunoriginalaccountid": ACCOUNT,
        "aliyunpublishaddr": "172.25.XX.XX",
        "data": data,
    }
