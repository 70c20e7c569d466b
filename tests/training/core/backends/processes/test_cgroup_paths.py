"""Where this process's cgroup is, from the texts of /proc/self/mountinfo and /proc/self/cgroup."""
import pytest

from ringflow.training.core.backends.processes.cgroup import cgroup_dir, mount_point, own_cgroup

HYBRID_MOUNTS = """\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
"""
UNIFIED_MOUNTS = "25 20 0:22 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
# A container with a cgroup namespace: the mount's root is where the container sits.
NAMESPACED_MOUNTS = "40 30 0:22 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
HYBRID_CGROUPS = "9:name=systemd:/\n6:freezer:/jobs\n1:cpu,cpuacct:/\n0::/user.slice/x.scope\n"


@pytest.mark.parametrize("mounts, version, controller, expected", [
    (HYBRID_MOUNTS, 2, "", ("/sys/fs/cgroup/unified", "/")),
    (HYBRID_MOUNTS, 1, "freezer", ("/sys/fs/cgroup/freezer", "/")),
    (HYBRID_MOUNTS, 1, "pids", None),
    (UNIFIED_MOUNTS, 2, "", ("/sys/fs/cgroup", "/")),
    (UNIFIED_MOUNTS, 1, "freezer", None),
    (NAMESPACED_MOUNTS, 2, "", ("/sys/fs/cgroup", "/kubepods/pod1")),
    ("", 2, "", None),
])
def test_mount_point(mounts, version, controller, expected):
    assert mount_point(mounts, version, controller) == expected


@pytest.mark.parametrize("cgroups, version, controller, expected", [
    (HYBRID_CGROUPS, 2, "", "/user.slice/x.scope"),
    (HYBRID_CGROUPS, 1, "freezer", "/jobs"),
    (HYBRID_CGROUPS, 1, "cpuacct", "/"),
    (HYBRID_CGROUPS, 1, "pids", None),
    ("0::/\n", 1, "freezer", None),
])
def test_own_cgroup(cgroups, version, controller, expected):
    assert own_cgroup(cgroups, version, controller) == expected


@pytest.mark.parametrize("mount, root, path, expected", [
    ("/sys/fs/cgroup", "/", "/user.slice/x.scope", "/sys/fs/cgroup/user.slice/x.scope"),
    ("/sys/fs/cgroup/unified", "/", "/", "/sys/fs/cgroup/unified"),
    ("/sys/fs/cgroup", "/kubepods/pod1", "/kubepods/pod1/c", "/sys/fs/cgroup/c"),
    ("/sys/fs/cgroup", "/kubepods/pod1", "/elsewhere", None),  # the mount does not show it
])
def test_cgroup_dir(mount, root, path, expected):
    assert cgroup_dir(mount, root, path) == expected


def test_a_cgroup_removed_while_its_members_are_read_has_none(tmp_path, monkeypatch):
    """cgroup v2 answers a read of a removed cgroup's cgroup.procs with ENODEV (the supervisor released
    it as the job ended): no members, not an error for whoever asked for the job's status."""
    import errno

    from ringflow.training.core.backends.processes import cgroup

    (tmp_path / "child").mkdir()
    real_read = cgroup._read

    def read(path: str) -> str:
        if "child" in path:
            raise OSError(errno.ENODEV, "No such device")
        return real_read(path)

    (tmp_path / "cgroup.procs").write_text("")
    monkeypatch.setattr(cgroup, "_read", read)
    assert cgroup.CgroupV2(str(tmp_path)).members() == []
