"""Every process a local job makes, tracked as a whole, so that stopping the job ends all of them.

proc: reading /proc (who a process is, its state, its children) and signalling exactly that process.
tracker: what a tracked set of processes offers (members, kill_all, spawn, record).
cgroup: a cgroup per job (v2 `cgroup.kill`, or the v1 freezer); subreaper: the fallback, a process tree
kept whole by PR_SET_CHILD_SUBREAPER. tracking: which one runs here, and reopening one from its record.
stop: SIGTERM, a grace period, SIGKILL to whatever is left in any state, then a bounded check that none is.
supervise: the process a local job runs under (the local backend's launch).
"""
