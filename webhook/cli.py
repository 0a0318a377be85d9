"""Subcommand `vgpu webhook`: the mutating admission webhook that opts pods in (vgpu.webhook.mutation).

Discovered by vgpu/cli.py; heavy imports happen inside the command function.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def register(subparsers: Any) -> None:
    """Add the `webhook` subcommand."""
    p = subparsers.add_parser(
        "webhook", help="run the mutating admission webhook",
        description="Serve admission.k8s.io/v1 AdmissionReview on POST /mutate-pods over HTTPS: pods asking for "
                    "vGPU resources (ours or HAMi's) get the vGPU scheduler, our resource names and quota totals.")
    p.add_argument("--listen", default=":9443", help="address HOST:PORT (default :9443)")
    p.add_argument("--tls-cert-file", required=True, help="serving certificate (PEM), signed by the CA in the "
                                                          "MutatingWebhookConfiguration's caBundle")
    p.add_argument("--tls-private-key-file", required=True, help="the certificate's private key (PEM)")
    p.add_argument("--config", help="the scheduler's YAML configuration file: its sharing section (resource names, "
                                    "hami_names, memory factor, quota_card_mib) is read; default: the defaults")
    p.add_argument("--scheduler-name", default=None, help="the schedulerName pods get (default vgpu-scheduler)")
    p.add_argument("--replace-scheduler-names", type=_names, default=None,
                   help="comma list of the schedulerName values replaced (default default-scheduler, which the API "
                        "server writes where a pod names none)")
    p.add_argument("--translate-hami-names", action=argparse.BooleanOptionalAction, default=True,
                   help="rewrite HAMi's resource names to ours (default on)")
    p.set_defaults(func=_run_webhook)


def _run_webhook(args: argparse.Namespace) -> int:
    import asyncio

    from vgpu.configfile import read_yaml_mapping, validated
    from vgpu.httpserve import make_uvicorn_server, parse_listen
    from vgpu.resources import SCHEDULER_NAME, SharingConfig
    from vgpu.webhook.mutation import DEFAULT_REPLACED, MutationSettings
    from vgpu.webhook.server import create_app

    sharing = SharingConfig()
    if args.config:
        data = read_yaml_mapping(args.config, "--config")
        sharing = validated(SharingConfig, data.get("sharing") or {}, f"{args.config}, its sharing section")
    settings = MutationSettings(
        sharing=sharing,
        scheduler_name=args.scheduler_name or SCHEDULER_NAME,
        replace_scheduler_names=DEFAULT_REPLACED if args.replace_scheduler_names is None
        else args.replace_scheduler_names,
        translate_hami_names=args.translate_hami_names,
    )
    host, port = parse_listen(args.listen, 9443)
    server = make_uvicorn_server(create_app(settings), host, port, tls_cert_file=args.tls_cert_file,
                                 tls_key_file=args.tls_private_key_file, key_flag="--tls-private-key-file")
    asyncio.run(server.serve())
    return 0
