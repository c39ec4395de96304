"""Swarm: this aiops calling other aiops instances (`agent_call`), and what travels with a call.

`hops.py` is the call's header (depth and the instances it came through) and this instance's id;
`call.py` drives one call over the peer's `/api/v1` (submit, its event stream, stop);
`plugin.py` registers the `agent_call` tool. The receiving side is the API's submit
(`server/api.py`), which refuses a call too deep or looping back and makes it a `swarm` session.
See docs/SWARM.md.
"""
