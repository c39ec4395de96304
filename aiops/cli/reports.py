"""`aiops models`, `aiops plugins` and `aiops audit`: listings of the registry, plugins and audit log."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiops.cli.common import CliError, check_data_dir, load, parse_since, setup_file_logging


def cmd_models(args: argparse.Namespace) -> int:
    cfg = load(args)
    models = cfg.models
    if args.json:
        print(json.dumps([{"key": k, **m.model_dump(), "default": k == models.default_model,
                           "key_status": m.key_status()} for k, m in models.models.items()], indent=2))
        return 0
    print(f"{'':2}{'key':<14} {'type':<7} {'model_id':<30} {'enabled':<8} {'api key':<11} {'delegation':<11} url")
    for k, m in models.models.items():
        mark = "* " if k == models.default_model else "  "
        # The answer bound only matters for a target: "yes 60s" says both, "no" stays short.
        delegation = f"yes {m.delegation_timeout:g}s" if m.delegation else "no"
        print(f"{mark}{k:<14} {m.type:<7} {m.model_id:<30} {'yes' if m.enabled else 'no':<8} "
              f"{m.key_status():<11} {delegation:<11} {m.display_url()}")
    print("\n* default model. Keys come from the environment or .env (api_key_env in models.toml).\n"
          "delegation: a target of llm_clean_text / llm_clean_tool (delegation = true), with its "
          "delegation_timeout.")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    cfg = load(args)
    setup_file_logging(cfg, args.verbose)  # it starts an engine: its warnings go where the others' do

    async def run() -> list[Any]:
        from aiops.engine.engine import Engine

        engine = Engine(cfg)
        await engine.start()
        try:
            await engine.plugins_ready()  # e.g. mysql's connection check, which runs in the background
            return list(engine.plugin_status)
        finally:
            await engine.stop()

    statuses = asyncio.run(run())
    if args.json:
        print(json.dumps([s.to_dict() for s in statuses], indent=2))
        return 0
    width = max((len(s.name) for s in statuses), default=0)
    for s in statuses:
        print(f"{s.name:<{width}}  {s.state:<9} {s.reason}")
    if not statuses:
        print("no plugins found")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    cfg = load(args)
    since = parse_since(args.since) if args.since else None

    async def run() -> list[Any]:
        from aiops.engine.store import Store

        if not cfg.paths.db_path.exists():
            check_data_dir(cfg.paths.data_dir)  # no database yet: fine, unless the dir is not one
            return []
        store = Store(cfg.paths.db_path)
        await store.open()
        try:
            sid = None
            if args.session:
                row = await store.get_session(args.session)
                if row is None:
                    raise CliError(f"no session {args.session!r}")
                sid = row.id
            return await store.audit(sid, since)
        finally:
            await store.close()

    rows = asyncio.run(run())
    if args.json:
        for r in rows:
            print(json.dumps(r.to_dict(), default=str))
        return 0
    if not rows:
        print("no audit entries")
    for r in rows:
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ts))
        what = " ".join(x for x in (r.tool, r.operation) if x)
        decision = f"{r.decision}" + (f" ({r.scope})" if r.scope else "") if r.decision else ""
        by = f"by {r.actor}" if r.actor else ""
        detail = ""
        data = r.data if isinstance(r.data, dict) else {}
        gate, grant, call_args = data.get("gate"), data.get("grant"), data.get("args")
        if gate:
            detail = gate.get("summary", "")
            if grant:  # passed by a session grant
                detail += f" (grant {grant.get('id')})"
        elif grant:  # grant_revoked
            detail = f"grant {grant.get('id')} on {', '.join(grant.get('tables') or []) or '-'}"
        elif r.event == "prompt_edit":
            detail = f"section {data.get('section')} {data.get('operation')}"
        elif isinstance(data.get("sql"), str):  # operator_db
            detail = data["sql"]
        elif isinstance(call_args, dict):  # policy_denied: what the call would have done
            sql = call_args.get("sql")
            detail = sql if isinstance(sql, str) else json.dumps(call_args, ensure_ascii=False, default=str)
        detail = " ".join(str(detail).split())
        print(f"{t}  {r.session_id or '-':<18} {r.event:<14} {what:<24} {decision:<18} {by:<16} {detail}")
    return 0
