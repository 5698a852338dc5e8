"""The worker default counts the container's CPU quota, not the host's cores (cgroup v1 and v2)."""

from __future__ import annotations

from pathlib import Path

from low_level.capture.cpuquota import cgroup_cpu_limit, usable_cpus
from low_level.capture.workers import default_workers


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def test_cgroup_v2_quota_in_a_container_and_on_the_host(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "150000 100000")  # a container: its cgroup is the mount's root
    assert cgroup_cpu_limit(tmp_path, "0::/") == 1.5
    host = tmp_path / "h"
    _write(host, "cpu.max", "max 100000")
    _write(host, "system.slice/agent.scope/cpu.max", "200000 100000")
    assert cgroup_cpu_limit(host, "0::/system.slice/agent.scope") == 2.0
    assert cgroup_cpu_limit(host, "0::/") is None


def test_cgroup_v1_quota_and_none(tmp_path: Path) -> None:
    _write(tmp_path, "cpu,cpuacct/cpu.cfs_quota_us", "50000")
    _write(tmp_path, "cpu,cpuacct/cpu.cfs_period_us", "100000")
    proc = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc"
    assert cgroup_cpu_limit(tmp_path, proc) == 0.5  # /docker/abc is not under the mount: its root counts
    assert usable_cpus(tmp_path, proc) == 1
    free = tmp_path / "free"
    _write(free, "cpu,cpuacct/cpu.cfs_quota_us", "-1")
    _write(free, "cpu,cpuacct/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_limit(free, proc) is None
    assert cgroup_cpu_limit(tmp_path / "nothing", proc) is None


def test_worker_default_uses_the_quota(monkeypatch) -> None:
    monkeypatch.setattr("low_level.capture.workers.usable_cpus", lambda: 3)
    assert default_workers("afpacket:eth0") == 1
    monkeypatch.setattr("low_level.capture.workers.usable_cpus", lambda: 8)
    assert default_workers("afpacket:eth0") == 4
    assert default_workers("pcap:/x.pcap") == 1
