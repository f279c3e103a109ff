"""``dlc status`` and ``dlc health``: the cluster as AWS and the master see it.

AWS says which instances exist (Auto Scaling: lifecycle and health; EC2: address, type,
state); the master says what the cluster made of them (``dl-health --json``: membership
generation, each member's checks, the launches that failed and why) and which jobs run
(``dl-jobs --json``). A node is joined
on its private address. What cannot be had (the master unreachable, ``dl-jobs`` missing, a
price unknown) is reported as such, with the reason, and the rest is still shown.
"""

from __future__ import annotations

import datetime
import re

from bootstrap_scripts.protocol import launches
from dlc import aws, cloudwatch, cost, wake
from dlc.errors import DlcError
from dlc.remote import Remote
from dlc.target import Target

#: Job states that are over.
FINISHED = ("succeeded", "failed", "cancelled", "budget")
_AGE = re.compile(r"(-?\d+(?:\.\d+)?)s ago")
_LEAD_INT = re.compile(r"^\s*(\d+)")


def cell(check: dict | None) -> tuple[bool | None, str]:
    if not isinstance(check, dict):
        return None, ""
    return bool(check.get("ok")), str(check.get("detail", ""))


def heartbeat_age(detail: str) -> float | None:
    m = _AGE.search(detail)
    return float(m.group(1)) if m else None


def merge_nodes(instances: list[aws.Instance], health: dict | None) -> list[dict]:
    """One row per instance (and per member AWS no longer lists), joined on the address."""
    members = {n.get("address"): n for n in (health or {}).get("nodes", [])}
    rows = []
    for inst in instances:
        rows.append(node_row(inst.to_dict(), members.pop(inst.address, None)))
    for address, m in members.items():  # a member whose instance is gone
        rows.append(node_row({"instance_id": "", "role": m.get("role", ""), "address": address,
                              "lifecycle": "not in its group", "health": "", "state": "",
                              "instance_type": ""}, m))
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0,
                             r["role"] != "master", r["address"]))
    return rows


def node_row(inst: dict, member: dict | None) -> dict:
    _gpus_ok, gpus = cell((member or {}).get("gpus"))
    gen_ok, gen = cell((member or {}).get("generation"))
    hb_ok, hb = cell((member or {}).get("reachable"))
    m = _LEAD_INT.match(gpus)
    if member is None:
        health = "not a member"
    else:
        failing = [f"{k}: {v.get('detail', '')}" for k, v in member.items()
                   if isinstance(v, dict) and not v.get("ok", True)]
        health = "ok" if member.get("ok") else "FAIL " + "; ".join(failing)
    return {"instance_id": inst.get("instance_id", ""), "role": inst.get("role", ""),
            "address": inst.get("address", ""), "instance_type": inst.get("instance_type", ""),
            "lifecycle": inst.get("lifecycle", ""), "asg_health": inst.get("health", ""),
            "ec2_state": inst.get("state", ""),
            "rank": member.get("rank") if member else None,
            "gpus": int(m.group(1)) if m else None,
            "health": health, "healthy": bool(member and member.get("ok")),
            "generation_applied": gen.split("/")[0] if gen else None,
            "generation_ok": gen_ok,
            "heartbeat_age_s": heartbeat_age(hb), "heartbeat": hb, "heartbeat_ok": hb_ok}


def clock(ts: object) -> str:
    """A job record's epoch seconds as local time (``-`` when unset)."""
    if not isinstance(ts, int | float) or not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def jobs_list(data: object) -> list[dict]:
    """``dl-jobs --json``'s jobs, whether it prints a list or ``{"jobs": [...]}``."""
    if isinstance(data, dict):
        data = data.get("jobs", [])
    return [j for j in data if isinstance(j, dict)] if isinstance(data, list) else []


#: ``dl-jobs --json --from K`` pages read at most (a guard against a master that never
#: says the last page came).
MAX_LIST_PAGES = 500


def jobs_listing(remote: Remote) -> dict:
    """``dl-jobs --json`` whole (``controller``, ``idle_stop``, ``jobs``), read page after
    page (``--from K``) because Run Command returns only the first 24,000 characters of a
    command's output and the list grows with every job; a job seen twice (the list moved
    between pages) is kept once. A master whose dl-jobs has no ``--from`` is asked for the
    whole list at once."""
    jobs: dict[str, dict] = {}
    head: dict = {}
    start: int | None = 0
    for _ in range(MAX_LIST_PAGES):
        argv = ["dl-jobs", "--json", "--from", str(start)]
        res = remote.run(argv)
        if res.code == 2 and "unrecognized arguments: --from" in res.stderr:
            whole = remote.json(["dl-jobs", "--json"])
            return whole if isinstance(whole, dict) else {"jobs": jobs_list(whole)}
        page = remote.parse(argv, res)
        if not isinstance(page, dict) or not isinstance(page.get("jobs"), list):
            raise DlcError(f"dl-jobs --json --from {start} answered no page: "
                           f"{str(page)[:300]!r}")
        head = {k: v for k, v in page.items() if k not in ("jobs", "next", "total")}
        for job in jobs_list(page):
            jobs[job_id(job)] = job
        after = page.get("next")
        if after is None:
            return {**head, "jobs": list(jobs.values())}
        if not isinstance(after, int) or after <= start:
            raise DlcError(f"dl-jobs --json --from {start} answered next={after!r}: not a "
                           "later page")
        start = after
    raise DlcError(f"dl-jobs --json: more than {MAX_LIST_PAGES} pages of jobs")


def job_id(job: dict) -> str:
    return str(job.get("job_id") or job.get("id") or "")


def idle_line(rec: object) -> str:
    """The job controller's idle stop (``cluster/idle-stop.json``, via ``dl-jobs --json``)
    in one line: when the workers stop, or that they stopped and what brings them back."""
    if not isinstance(rec, dict):
        return ""
    failed = f" ({rec['message']})" if "failed" in str(rec.get("message", "")) else ""
    if rec.get("state") == "stopping":  # recorded before the stop call, which may not be done
        return (f"idle stop: idle since {clock(rec.get('idle_since'))}, workers STOPPING "
                f"since {clock(rec.get('stopped_at'))} (were {rec.get('desired_before', '?')}); "
                f"dlc submit scales them back{failed}")
    if rec.get("stopped_at"):
        return (f"idle stop: idle since {clock(rec.get('idle_since'))}, workers STOPPED at "
                f"{clock(rec.get('stopped_at'))} (were {rec.get('desired_before', '?')}); "
                f"dlc submit scales them back{failed}")
    if rec.get("state") == "idle":
        return (f"idle stop: idle since {clock(rec.get('idle_since'))}, workers stop at "
                f"{clock(rec.get('stop_at'))}{failed}")
    if rec.get("state") == "disabled":
        return "idle stop: off (idleStopMinutes 0)"
    minutes = float(rec.get("idle_seconds") or 0) / 60
    return f"idle stop: busy; workers stop {minutes:g} min after the last job{failed}"


def gather(target: Target, *, with_cost: bool = True) -> dict:
    """Everything ``dlc status`` shows, as one JSON-able dict."""
    stack = aws.describe_stack(target)
    out: dict = {"stack": {"name": stack.name, "status": stack.status,
                           "region": target.region},
                 "errors": {}}
    # the CloudWatch dashboard (a stack output since the observability construct)
    board = stack.outputs.get(cloudwatch.DASHBOARD_OUTPUT)
    out["dashboard"] = cloudwatch.dashboard_url(target.region, board) if board else None
    instances = aws.instances(target, stack)
    groups = aws.groups(target, stack)
    out["master_stopped"] = wake.is_stopped(groups["master"])
    health: dict | None = None
    jobs: list[dict] | None = None
    try:
        master = aws.master_instance(target, stack, instances)
        out["master"] = master.instance_id
        remote = Remote(target, master.instance_id)
        try:
            data = remote.json(["dl-health", "--json"], allow_codes=(0, 1))
            health = data if isinstance(data, dict) else None
        except DlcError as exc:
            out["errors"]["health"] = str(exc)
        try:
            listed = jobs_listing(remote)
            jobs = jobs_list(listed)
            out["idle_stop"] = listed.get("idle_stop") if isinstance(listed, dict) else None
        except DlcError as exc:
            out["errors"]["jobs"] = str(exc)
    except DlcError as exc:
        out["master"] = None
        out["errors"]["master"] = str(exc)
    out["nodes"] = merge_nodes(instances, health)
    # what the capacity adjuster could not launch (zone, types, EC2's cause), as the master
    # agent recorded it on EFS: why the cluster is smaller, or in another zone, than asked
    out["launch_failures"] = list((health or {}).get("launch_failures", []))
    out["membership"] = {"generation": (health or {}).get("generation"),
                         "healthy": (health or {}).get("healthy"),
                         "members": len((health or {}).get("nodes", []))}
    if jobs is not None:
        out["jobs"] = {"running": [j for j in jobs if j.get("state") in
                                   ("running", "restarting")],
                       "queued": [j for j in jobs if j.get("state") == "queued"],
                       "total": len(jobs)}
    else:
        out["jobs"] = None
    if with_cost:
        running = [i.instance_type for i in instances
                   if i.state in ("running", "pending") and i.instance_type]
        out["cost"] = cost.estimate(target, running, target.region)
        try:
            out["cost_tag"] = {"key": aws.CLUSTER_TAG_KEY, "status": aws.cost_tag_status(
                target, aws.CLUSTER_TAG_KEY), "error": ""}
        except DlcError as exc:
            out["cost_tag"] = {"key": aws.CLUSTER_TAG_KEY, "status": None, "error": str(exc)}
    return out


def render(console, st: dict) -> None:
    """The status for people: a header, the nodes table, jobs and cost."""
    from rich.table import Table

    s = st["stack"]
    m = st["membership"]
    console.print(f"[bold]{s['name']}[/] in {s['region']}: {s['status']}; membership "
                  f"generation {m['generation'] if m['generation'] is not None else 'unknown'}"
                  f", {m['members']} member(s), "
                  + ("[green]healthy[/]" if m["healthy"] else
                     "[red]UNHEALTHY[/]" if m["healthy"] is False else "health unknown"),
                  highlight=False)
    t = Table(title="nodes")
    for col in ("rank", "instance", "role", "address", "type", "GPUs", "state", "health",
                "gen", "heartbeat"):
        t.add_column(col)
    for n in st["nodes"]:
        hb = (f"{n['heartbeat_age_s']:.1f}s ago" if n["heartbeat_age_s"] is not None
              else n["heartbeat"] or "-")
        t.add_row("-" if n["rank"] is None else str(n["rank"]), n["instance_id"] or "-",
                  n["role"], n["address"] or "-", n["instance_type"] or "-",
                  "-" if n["gpus"] is None else str(n["gpus"]),
                  n["lifecycle"] + (f"/{n['asg_health']}" if n["asg_health"] not in
                                    ("", "Healthy") else ""),
                  "[green]ok[/]" if n["healthy"] else f"[red]{n['health']}[/]",
                  n["generation_applied"] or "-", hb)
    console.print(t)
    failed = st.get("launch_failures") or []
    if failed:
        console.print(f"failed launches ({len(failed)}):", highlight=False)
        for a in failed[-10:]:
            console.print(f"  {a.get('role', '?')} {a.get('asg', '?')}: "
                          f"{launches.describe(a)}", highlight=False, soft_wrap=True)
    jobs = st["jobs"]
    if jobs is None:
        console.print(f"jobs: unknown ({st['errors'].get('jobs', 'no master')})",
                      highlight=False)
    else:
        running = ", ".join(f"{job_id(j)} ({j.get('state')})" for j in jobs["running"])
        queued = ", ".join(job_id(j) for j in jobs["queued"])
        console.print(f"jobs: {len(jobs['running'])} running{': ' + running if running else ''}"
                      f"; {len(jobs['queued'])} queued{': ' + queued if queued else ''}",
                      highlight=False)
    if st.get("master_stopped"):
        console.print(wake.STOPPED_NOTE, highlight=False)
    idle = idle_line(st.get("idle_stop"))
    if idle:
        console.print(idle, highlight=False)
    if st.get("dashboard"):
        console.print(f"dashboard: {st['dashboard']}", highlight=False, soft_wrap=True)
    c = st.get("cost")
    if c is not None:
        if c["usd_per_hour"] == "unknown":
            why = "; ".join(f"{t}: {r}" for t, r in c["unknown"].items())
            console.print(f"cost: unknown ({why})", highlight=False, soft_wrap=True)
        else:
            kinds = ", ".join(f"{v['count']} x {t} at ${cost.usd(v['usd_per_hour_each'])}/h"
                              for t, v in c["by_type"].items())
            console.print(f"cost: ${cost.usd(c['usd_per_hour'])}/hour on demand ({kinds})",
                          highlight=False)
    tag = st.get("cost_tag")
    if tag is not None:
        console.print(cost.tag_line(tag["key"], tag["status"], tag["error"]), highlight=False,
                      soft_wrap=True)
    for what, err in st["errors"].items():
        if what != "jobs":
            console.print(f"[yellow]{what}: {err}[/]", highlight=False, soft_wrap=True)
