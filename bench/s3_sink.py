"""An S3 endpoint that takes uploads and keeps nothing: a store that costs the machine little, so a bench can see
what the client itself can do with the cores (moto, one Python process, is the limit long before the client is).

It answers what a checkpoint commit sends (CreateMultipartUpload, UploadPart, CompleteMultipartUpload, PutObject)
well enough for botocore, reads every body to its end, and discards it. Several processes share the port
(``SO_REUSEPORT``): ``python -m bench.s3_sink --port 9000 --processes 2``. Bench only; nothing is checked.
"""

from __future__ import annotations

import argparse
import multiprocessing
import uuid

from aiohttp import web

CHUNK = 1024 * 1024


async def handle(request: web.Request) -> web.Response:
    while await request.content.readany():  # the body, read and dropped
        pass
    query = request.query
    if request.method == "POST" and "uploads" in query:
        upload_id = uuid.uuid4().hex
        xml = f"<InitiateMultipartUploadResult><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
        return web.Response(text=xml, content_type="application/xml")
    if request.method == "POST" and "uploadId" in query:
        xml = '<CompleteMultipartUploadResult><ETag>"sink"</ETag></CompleteMultipartUploadResult>'
        return web.Response(text=xml, content_type="application/xml")
    headers = {"ETag": '"sink"'}
    checksum = request.headers.get("x-amz-checksum-crc32c")
    if checksum:
        headers["x-amz-checksum-crc32c"] = checksum
    return web.Response(headers=headers)


def serve(port: int) -> None:
    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, reuse_port=True, access_log=None, print=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    workers = [multiprocessing.Process(target=serve, args=(args.port,), daemon=True) for _ in range(args.processes - 1)]
    for worker in workers:
        worker.start()
    serve(args.port)


if __name__ == "__main__":
    main()
