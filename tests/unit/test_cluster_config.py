"""The local cluster's config writers: node, GRES, accounting and version-dependent lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastico.cluster import ClusterStatus, DaemonStatus, LocalCluster, config, daemons, install
from slurm_elastico.cluster.config import ClusterSpec, Layout, Ports
from slurm_elastico.errors import ClusterError

ROOT = Path("/srv/elastico-test")


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def settings(text: str) -> dict[str, str]:
    """Key=value lines other than NodeName/PartitionName, as a dict (a repeated key would be lost: checked)."""
    pairs = [line.split("=", 1) for line in lines(text) if not line.startswith(("NodeName=", "PartitionName="))]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated keys: {keys}"
    return dict(pairs)


def spec(**kw) -> ClusterSpec:
    return ClusterSpec(hostname="vm", **kw)


LAYOUT = Layout(ROOT)


def test_ports_from_base_keep_away_from_system_slurm():
    ports = Ports.from_base()
    assert (ports.slurmctld, ports.slurmdbd, ports.mariadb, ports.slurmd(1), ports.slurmd(4)) == (
        16817, 16819, 16820, 17001, 17004)
    assert Ports.from_base(26817).slurmd(2) == 27002
    with pytest.raises(ClusterError, match="port base 80"):
        Ports.from_base(80)


@pytest.mark.parametrize("text, ranges", [
    ("32768\t60999\n", [(32768, 60999)]),
    ("\n", []),
    ("8080,9000-9010\n", [(8080, 8080), (9000, 9010)]),
])
def test_parse_port_ranges_reads_the_kernels_two_forms(text, ranges):
    assert config.parse_port_ranges(text) == ranges


def test_ephemeral_ports_are_those_in_the_outgoing_range_and_not_reserved():
    ports = [16817, 32767, 32768, 37001, 37002, 60999, 61000]
    assert config.ephemeral(ports, (32768, 60999), []) == [32768, 37001, 37002, 60999]
    assert config.ephemeral(ports, (32768, 60999), [(37000, 37001), (60999, 60999)]) == [32768, 37002]
    # Every port a default cluster, the tests' session cluster or the reshape benchmark uses lies outside.
    for base in (16817, 18817, 20817, 26817, 26917, 27017, 27317):
        p = Ports.from_base(base)
        used = [p.slurmctld, p.slurmdbd, p.mariadb, *(p.slurmd(i) for i in range(1, 65))]
        assert config.ephemeral(used, (32768, 60999), []) == []


def test_default_node_line_has_four_nodes_with_their_ports_and_gres():
    conf = config.slurm_conf(spec(), LAYOUT)
    node = [line for line in lines(conf) if line.startswith("NodeName=")]
    assert node == ["NodeName=n[1-4] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=8 "
                    "RealMemory=8000 Gres=gpu:4,mps:400 State=UNKNOWN"]
    assert "PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP" in lines(conf)
    s = settings(conf)
    assert s["SlurmctldHost"] == "vm(127.0.0.1)"
    assert s["SlurmctldPort"] == "16817"
    assert s["GresTypes"] == "gpu,mps"
    assert s["SelectType"] == "select/cons_tres" and s["SelectTypeParameters"] == "CR_Core"
    assert s["JobRequeue"] == "1" and s["ReturnToService"] == "2" and s["KillWait"] == "30"
    assert s["SlurmdParameters"] == "config_overrides"
    assert s["AuthInfo"] == f"socket={ROOT}/run/munge.sock"
    # %n: one spool, pid file and log per slurmd on the one host.
    assert s["SlurmdSpoolDir"].endswith("/%n") and "%n" in s["SlurmdPidFile"] and "%n" in s["SlurmdLogFile"]


def test_single_node_uses_plain_names_not_ranges():
    conf = config.slurm_conf(spec(nodes=1, gpus_per_node=1, kill_wait=5), LAYOUT)
    node = next(line for line in lines(conf) if line.startswith("NodeName="))
    assert "NodeName=n1 " in node and "Port=17001 " in node and "Gres=gpu:1,mps:100" in node
    assert settings(conf)["KillWait"] == "5"
    gres = config.gres_conf(spec(nodes=1, gpus_per_node=1), LAYOUT)
    assert f"NodeName=n1 Name=gpu File={ROOT}/dev/n1/nvidia0" in lines(gres)


def test_gres_lines_share_mps_over_all_gpus_of_each_node():
    gres = lines(config.gres_conf(spec(nodes=2, gpus_per_node=3, shares_per_gpu=50), LAYOUT))
    assert gres[0] == "AutoDetect=off"
    assert gres[1:] == [
        f"NodeName=n1 Name=gpu File={ROOT}/dev/n1/nvidia[0-2]",
        f"NodeName=n1 Name=mps Count=150 File={ROOT}/dev/n1/nvidia[0-2] Flags=all_sharing",
        f"NodeName=n2 Name=gpu File={ROOT}/dev/n2/nvidia[0-2]",
        f"NodeName=n2 Name=mps Count=150 File={ROOT}/dev/n2/nvidia[0-2] Flags=all_sharing",
    ]
    node = next(line for line in lines(config.slurm_conf(spec(nodes=2, gpus_per_node=3, shares_per_gpu=50), LAYOUT))
                if line.startswith("NodeName="))
    assert "Gres=gpu:3,mps:150" in node


def test_accounting_on_uses_slurmdbd_and_tres_off_uses_jobcomp_file():
    on = settings(config.slurm_conf(spec(accounting=True), LAYOUT))
    off = settings(config.slurm_conf(spec(accounting=False), LAYOUT))
    assert on["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert on["AccountingStoragePort"] == "16819"
    assert on["AccountingStorageTRES"] == "gres/gpu,gres/mps"
    # Typed GPUs are accounted by type too: sacct then says which type a job asked for (the what-if keeps it there).
    from slurm_elastico.cluster.gpu_types import parse_gpu_types
    typed = settings(config.slurm_conf(spec(accounting=True, nodes=3, gpu_types=parse_gpu_types("t4:1,a100:2")),
                                       LAYOUT))
    assert typed["AccountingStorageTRES"] == "gres/gpu,gres/mps,gres/gpu:t4,gres/gpu:a100"
    assert on["AccountingStoreFlags"] == "job_comment"
    # The dbd connection takes its munge socket from here, not from AuthInfo.
    assert on["AccountingStoragePass"] == f"{ROOT}/run/munge.sock"
    assert "JobCompType" not in on
    assert off["JobCompType"] == "jobcomp/filetxt" and off["JobCompLoc"] == f"{ROOT}/logs/jobcomp.txt"
    # AccountingStorageTRES is fatal without slurmdbd.
    assert not any(k.startswith("AccountingStorage") for k in off)


def test_slurmdbd_conf_points_at_the_private_mariadb_and_munge():
    s = settings(config.slurmdbd_conf(spec(ports=Ports.from_base(20000)), LAYOUT, "s3cret-pass"))
    assert s["DbdPort"] == "20002" and s["StoragePort"] == "20003"
    assert s["StorageHost"] == "127.0.0.1" and s["DbdHost"] == "vm"
    assert s["StoragePass"] == "s3cret-pass" and s["StorageLoc"] == config.DB_NAME
    assert s["AuthInfo"] == f"socket={ROOT}/run/munge.sock"
    with pytest.raises(ClusterError, match="password"):
        config.slurmdbd_conf(spec(), LAYOUT, "a b'c")


def test_cgroup_conf_only_where_the_version_can_disable_cgroups():
    assert config.cgroup_conf(spec(version=(22, 5))) is None
    assert "CgroupPlugin=disabled" in lines(config.cgroup_conf(spec(version=(24, 11))))
    assert config.cgroup_conf(spec(version=(23, 2))) is not None


@pytest.mark.parametrize("text, version", [
    ("slurm-wlm 22.05.8\n", (22, 5)),
    ("slurm 24.11.5", (24, 11)),
    ("slurm 23.02", (23, 2)),
])
def test_parse_version(text, version):
    assert config.parse_version(text) == version


def test_parse_version_rejects_garbage():
    with pytest.raises(ClusterError, match="cannot read a Slurm version"):
        config.parse_version("command not found")


def test_spec_collects_every_bad_setting():
    with pytest.raises(ClusterError) as err:
        ClusterSpec(hostname="vm.example.org", nodes=0, shares_per_gpu=101)
    text = str(err.value)
    assert "nodes=0" in text and "shares_per_gpu=101" in text and "hostname=" in text


@pytest.mark.parametrize("path, problem", [
    ("relative/dir", "absolute"),
    ("/srv/with space", "space"),
    ("/srv/br[ack]et", "space or one of"),
    ("/" + "d" * 120, "too deep"),
])
def test_layout_rejects_paths_slurm_cannot_hold(path, problem):
    with pytest.raises(ClusterError, match=problem):
        Layout(Path(path))


def test_local_cluster_validates_at_construction_and_gives_env(tmp_path):
    with pytest.raises(ClusterError, match="gpus_per_node=0"):
        LocalCluster(tmp_path, gpus_per_node=0)
    cluster = LocalCluster(tmp_path / "c")
    assert cluster.env() == {"SLURM_CONF": str(tmp_path / "c" / "etc" / "slurm.conf")}
    assert cluster.slurm_conf == tmp_path / "c" / "etc" / "slurm.conf"
    assert cluster.nodes == ("n1", "n2", "n3", "n4")


def test_clusters_on_other_ports_get_their_own_cluster_name(tmp_path):
    # One helper per ClusterName on a host: the demo's cluster and the tests' must not share one.
    default = LocalCluster(tmp_path / "a")._spec_for((22, 5))
    other = LocalCluster(tmp_path / "b", port_base=20817)._spec_for((24, 11))
    assert default.name == "elastico" and other.name == "elastico20817"
    assert "ClusterName=elastico20817" in config.slurm_conf(other, Layout(tmp_path / "b")).splitlines()


def test_from_state_dir_uses_saved_settings_under_overrides(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "cluster.json").write_text('{"nodes": 2, "accounting": true, "unknown": 1}')
    cluster = LocalCluster.from_state_dir(tmp_path, nodes=None, gpus_per_node=2)
    assert cluster.nodes == ("n1", "n2") and cluster.accounting
    assert LocalCluster.from_state_dir(tmp_path, nodes=3).nodes == ("n1", "n2", "n3")


def test_a_cluster_runs_only_when_every_node_state_means_usable():
    # Node states as slurm.nodes writes them from 22.05 sinfo --json and 24.11 scontrol show node --json.
    up = (DaemonStatus("slurmctld", 1, "ctld.log"),)

    def running(*states):
        return ClusterStatus("d", "c", False, up, {f"n{i}": s for i, s in enumerate(states)}).running
    assert running("idle", "mixed", "allocated", "mixed+completing")
    assert not running("idle", "idle+not_responding")
    assert not running("idle+drain") and not running("down") and not running("idle+planned")
    assert not running()


def test_status_of_a_never_started_cluster_lists_every_daemon_stopped(tmp_path):
    state = LocalCluster(tmp_path, nodes=2, accounting=True).status()
    assert [d.name for d in state.daemons] == ["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"]
    assert state.stopped and not state.running and state.nodes == {}


def test_missing_packages_maps_binaries_to_debian_packages():
    assert install.missing_packages(False, find=lambda b: None) == ["munge", "slurm-client", "slurmctld", "slurmd"]
    assert install.missing_packages(True, find=lambda b: None if b in ("mariadbd", "sacctmgr") else "/x") == [
        "mariadb-server", "slurm-client"]
    assert install.missing_packages(True, find=lambda b: "/usr/bin/" + b) == []
    assert install.install_argv(["munge"]) == ["apt-get", "install", "-y", "--no-install-recommends", "munge"]


def test_running_pid_ignores_stale_pid_files_and_other_programs(tmp_path):
    import os

    pid_file = tmp_path / "x.pid"
    assert daemons.running_pid(pid_file, "slurmd") is None  # no file
    pid_file.write_text(f"{os.getpid()}\n")
    assert daemons.running_pid(pid_file, "slurmd") is None  # alive, but it is python, not slurmd
    assert daemons.running_pid(pid_file, daemons.proc_name(os.getpid())) == os.getpid()
    pid_file.write_text("garbage")
    assert daemons.running_pid(pid_file, "slurmd") is None


def test_zombie_counts_as_stopped(tmp_path):
    import subprocess

    child = subprocess.Popen(["true"])
    # Not yet reaped: kill -0 would succeed, /proc says Z.
    assert daemons.wait_for(lambda: daemons.proc_state(child.pid) == "Z", 5)
    assert not daemons.is_alive(child.pid)
    child.wait()
    assert daemons.proc_state(child.pid) is None


ETC_SLURM = Path(__file__).resolve().parents[2] / "etc" / "slurm"


def test_administrator_snippets_agree_with_the_generated_config():
    snippet = settings((ETC_SLURM / "slurm.conf.mps").read_text())
    generated = settings(config.slurm_conf(spec(accounting=True), LAYOUT))
    for key in ("GresTypes", "SelectType", "JobRequeue", "ReturnToService", "AccountingStorageType",
                "AccountingStorageTRES", "AccountingStoreFlags"):
        assert snippet[key] == generated[key], key
    gres = [line for line in lines((ETC_SLURM / "gres.conf.mps").read_text()) if "Name=mps" in line]
    assert gres and all("Flags=all_sharing" in line for line in gres)


def test_up_without_root_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="must be started as root"):
        LocalCluster(tmp_path).up()
    assert not (tmp_path / "etc").exists()  # refused before writing anything


def test_install_refuses_without_root_or_apt(monkeypatch):
    monkeypatch.setattr(install, "which", lambda binary: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root.*apt-get install munge slurm-client slurmctld slurmd"):
        install.ensure_installed(False)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    with pytest.raises(ClusterError, match="apt-get is not available"):
        install.ensure_installed(False)


def test_one_process_installs_at_a_time_and_the_ones_that_waited_find_the_packages(tmp_path, monkeypatch):
    """The test command starts six local clusters at once: on a clean machine their six `apt-get update`s ran at
    once, and all but one failed on apt's own lock (the lists, then dpkg's frontend). apt is a fake here (pure
    logic: who runs it when); the live suite's first start on a clean machine is the real check."""
    import threading
    import time

    monkeypatch.setattr(install, "INSTALL_LOCK", tmp_path / "install.lock")
    monkeypatch.setattr(install, "POLICY_RC_D", tmp_path / "policy-rc.d")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    done = threading.Event()
    monkeypatch.setattr(install, "which", lambda b: "/usr/bin/" + b if done.is_set() or b == "apt-get" else None)
    guard, running, most, calls = threading.Lock(), [0], [0], []

    def apt(argv, env, timeout):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append(argv[1])
        time.sleep(0.05)
        if argv[1] == "install":
            done.set()
        with guard:
            running[0] -= 1

    monkeypatch.setattr(install, "_apt", apt)
    got: list[list[str]] = []
    threads = [threading.Thread(target=lambda: got.append(install.ensure_installed(True))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and calls == ["update", "install"]  # one at a time, and once
    assert sorted(len(p) for p in got) == [0, 0, 0, len(install.missing_packages(True, find=lambda b: None))]
    assert not (tmp_path / "policy-rc.d").exists()


def test_cli_env_and_status_of_a_stopped_cluster(tmp_path):
    import json

    from click.testing import CliRunner

    from slurm_elastico.cli import main

    runner = CliRunner()
    env = runner.invoke(main, ["cluster", "env", "--state-dir", str(tmp_path)])
    assert env.exit_code == 0 and env.output == f"export SLURM_CONF={tmp_path}/etc/slurm.conf\n"
    status = runner.invoke(main, ["cluster", "status", "--json", "--state-dir", str(tmp_path)])
    assert status.exit_code == 1  # not running
    assert json.loads(status.output)["running"] is False
    down = runner.invoke(main, ["cluster", "down", "--state-dir", str(tmp_path)])
    assert down.exit_code == 0 and "nothing was running" in down.output
