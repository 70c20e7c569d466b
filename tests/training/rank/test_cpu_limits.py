"""The CPUs a process may use, read from the host (training/rank/cpu_limits.py): cgroup v2 and v1 quotas through
/proc/self/cgroup and /proc/self/mountinfo as a pod, a container and a plain host write them (here files
under tmp_path), and the order of CPUs by core from sysfs topology."""
import os

import pytest

from ringflow.training.rank.cpu_limits import by_core, cpu_quota_cores, usable_cpus


class Host:
    """A /proc/self/cgroup, a /proc/self/mountinfo and the cgroup folders they point at, under tmp_path."""

    def __init__(self, root):
        self.root = root
        self.mounts: list[str] = []
        self.cgroup: list[str] = []

    def mount(self, fstype: str, point: str, root: str = "/", options: str = "rw") -> "Host":
        n = len(self.mounts) + 30
        self.mounts.append(f"{n} 23 0:{n} {root} {self.root}{point} rw,nosuid,relatime shared:{n} - {fstype} "
                           f"{fstype} {options}")
        return self

    def member(self, line: str) -> "Host":
        self.cgroup.append(line)
        return self

    def write(self, folder: str, name: str, text: str) -> "Host":
        path = self.root / folder.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text + "\n")
        return self

    def quota(self):
        (self.root / "cgroup").write_text("\n".join(self.cgroup) + "\n")
        (self.root / "mountinfo").write_text("\n".join(self.mounts) + "\n")
        return cpu_quota_cores(str(self.root / "cgroup"), str(self.root / "mountinfo"))


def test_a_kubernetes_pod_on_cgroup_v2_the_tightest_of_its_cgroups(tmp_path):
    host = (Host(tmp_path).mount("cgroup2", "/sys/fs/cgroup").member("0::/kubepods/burstable/pod1/ctr")
            .write("/sys/fs/cgroup/kubepods", "cpu.max", "max 100000")
            .write("/sys/fs/cgroup/kubepods/burstable/pod1", "cpu.max", "250000 100000")
            .write("/sys/fs/cgroup/kubepods/burstable/pod1/ctr", "cpu.max", "max 100000"))
    assert host.quota() == 2.5
    host.write("/sys/fs/cgroup/kubepods/burstable", "cpu.max", "150000 100000")  # a parent bounds its children
    assert host.quota() == 1.5


def test_a_container_in_its_own_cgroup_namespace_reads_its_root(tmp_path):
    host = (Host(tmp_path).mount("cgroup2", "/sys/fs/cgroup").member("0::/")
            .write("/sys/fs/cgroup", "cpu.max", "200000 50000"))
    assert host.quota() == 4.0


def test_no_quota_anywhere(tmp_path):
    host = (Host(tmp_path).mount("cgroup2", "/sys/fs/cgroup").member("0::/user.slice")
            .write("/sys/fs/cgroup", "cpu.max", "max 100000").write("/sys/fs/cgroup/user.slice", "cpu.max", "max 100000"))
    assert host.quota() is None


def test_cgroup_v1_docker_without_a_cgroup_namespace(tmp_path):
    """The process sees its cgroup's host path; the container mounts that cgroup as the hierarchy's root."""
    host = (Host(tmp_path).mount("tmpfs", "/sys/fs/cgroup", options="rw,mode=755")
            .mount("cgroup", "/sys/fs/cgroup/cpu,cpuacct", root="/docker/abc", options="rw,cpu,cpuacct")
            .mount("cgroup", "/sys/fs/cgroup/cpuset", root="/docker/abc", options="rw,cpuset")
            .member("5:cpuset:/docker/abc").member("4:cpu,cpuacct:/docker/abc").member("1:name=systemd:/docker/abc")
            .write("/sys/fs/cgroup/cpu,cpuacct", "cpu.cfs_quota_us", "50000")
            .write("/sys/fs/cgroup/cpu,cpuacct", "cpu.cfs_period_us", "100000"))
    assert host.quota() == 0.5
    host.write("/sys/fs/cgroup/cpu,cpuacct", "cpu.cfs_quota_us", "-1")
    assert host.quota() is None


def test_cgroup_v1_nested_and_a_hybrid_host(tmp_path):
    """This machine's layout: v1 controllers plus a v2 hierarchy without the cpu controller."""
    host = (Host(tmp_path).mount("cgroup", "/sys/fs/cgroup/cpu", options="rw,cpu")
            .mount("cgroup", "/sys/fs/cgroup/cpuacct", options="rw,cpuacct")
            .mount("cgroup2", "/sys/fs/cgroup/unified")
            .member("2:cpuacct:/").member("1:cpu:/jobs/train").member("0::/jobs/train")
            .write("/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", "-1").write("/sys/fs/cgroup/cpu", "cpu.cfs_period_us", "100000")
            .write("/sys/fs/cgroup/cpu/jobs/train", "cpu.cfs_quota_us", "300000")
            .write("/sys/fs/cgroup/cpu/jobs/train", "cpu.cfs_period_us", "100000")
            .write("/sys/fs/cgroup/cpuacct/jobs/train", "cpu.cfs_quota_us", "1")  # not the cpu controller's
            .write("/sys/fs/cgroup/unified/jobs/train", "cgroup.procs", ""))
    assert host.quota() == 3.0


def test_a_mount_point_with_a_space(tmp_path):
    host = Host(tmp_path).member("0::/")
    host.mounts.append(f"40 23 0:40 / {tmp_path}/cgroup\\040fs rw - cgroup2 cgroup2 rw")
    host.write("/cgroup fs", "cpu.max", "100000 100000")
    assert host.quota() == 1.0


@pytest.mark.parametrize("text", ["garbage", "100000", "0 100000", "100000 0"])
def test_unreadable_limits_are_no_limit(tmp_path, text):
    host = Host(tmp_path).mount("cgroup2", "/sys/fs/cgroup").member("0::/").write("/sys/fs/cgroup", "cpu.max", text)
    assert host.quota() is None


def test_no_cgroup_files_is_no_limit(tmp_path):
    assert cpu_quota_cores(str(tmp_path / "absent"), str(tmp_path / "absent")) is None


def test_this_hosts_quota_reads():
    quota = cpu_quota_cores()
    assert quota is None or quota > 0


def topology(root, cores_of: dict[int, tuple[int, int]]) -> str:
    for cpu, (package, core) in cores_of.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return str(root)


def test_a_cores_hardware_threads_come_together(tmp_path):
    # 2 packages of 2 cores with 2 threads each, numbered as Linux does: first threads 0-3, second 4-7.
    sysfs = topology(tmp_path, {cpu: (cpu % 4 // 2, cpu % 2) for cpu in range(8)})
    assert by_core(range(8), sysfs) == (0, 4, 1, 5, 2, 6, 3, 7)
    assert by_core({6, 2, 3}, sysfs) == (2, 6, 3)


def test_without_topology_by_number(tmp_path):
    assert by_core({3, 1, 2}, str(tmp_path)) == (1, 2, 3)


def test_this_processes_cpus():
    assert sorted(usable_cpus()) == sorted(os.sched_getaffinity(0))
