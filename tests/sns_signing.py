"""Sign SNS messages exactly as SNS does, with a throwaway self-signed certificate (written apart from the bot)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

# The fields SNS signs, in the order it signs them (the SNS developer guide, "Verifying message signatures").
_SIGNED = {
    "Notification": ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"],
    "SubscriptionConfirmation": ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"],
    "UnsubscribeConfirmation": ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"],
}


class SnsSigner:
    """An RSA key and its self-signed certificate, standing in for SNS's signing certificate."""

    def __init__(self, common_name: str = "sns.amazonaws.com") -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.now(UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=30))
            .sign(self.key, hashes.SHA256())
        )
        self.pem = cert.public_bytes(serialization.Encoding.PEM)

    def sign(self, message: dict[str, Any], cert_url: str, version: str = "2") -> dict[str, Any]:
        """``message`` with SignatureVersion, Signature and SigningCertURL added, as SNS sends it."""
        text = "".join(f"{key}\n{message[key]}\n" for key in _SIGNED[message["Type"]] if key in message)
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
        signature = self.key.sign(text.encode(), padding.PKCS1v15(), algorithm)
        return {
            **message,
            "SignatureVersion": version,
            "Signature": base64.b64encode(signature).decode(),
            "SigningCertURL": cert_url,
        }


def sns_timestamp(at: datetime | None = None) -> str:
    """SNS's Timestamp format: ISO 8601 in UTC with milliseconds and a Z."""
    at = at or datetime.now(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def notification(
    topic_arn: str, message: str, *, subject: str | None = None, at: datetime | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": sns_timestamp(at),
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=x",
    }
    if subject is not None:
        body["Subject"] = subject
    return body


def confirmation(topic_arn: str, subscribe_url: str, kind: str = "SubscriptionConfirmation") -> dict[str, Any]:
    token = uuid.uuid4().hex * 2
    return {
        "Type": kind,
        "MessageId": str(uuid.uuid4()),
        "Token": token,
        "TopicArn": topic_arn,
        "Message": f"You have chosen to subscribe to the topic {topic_arn}.\nTo confirm, visit the SubscribeURL.",
        "SubscribeURL": subscribe_url,
        "Timestamp": sns_timestamp(),
    }
