#!/usr/bin/env python3
"""Install and run a local Flink session cluster with Beam's Flink job server, on 127.0.0.1.

The engine is Beam's Flink runner and the Flink runtime it depends on, resolved from Maven
Central by the pinned ``pom.xml`` (``mvn dependency:build-classpath``, nothing built) and checked
jar by jar against ``jars.sha256``. The cluster is a JobManager and N TaskManagers (one slot
each by default) started from that classpath, plus one Beam job server bound to 127.0.0.1 that
submits to it; each TaskManager starts its SDK workers with ``specrag-worker`` (PROCESS
environment), so the workers run this checkout's installed specrag with the job's options.
Standard library only, so any Python can drive it; tests import it, operators run it:

    python deploy/flink/launch.py install            # idempotent (~152 MB of jars into ~/.m2)
    python deploy/flink/launch.py start              # detached; prints the flags a job takes
    specrag answer ... $(python deploy/flink/launch.py flags)
    python deploy/flink/launch.py stop

Versions: Beam's job server for the installed Python SDK (2.77) is not served by the registries
these machines reach; the Beam Flink runner 2.62.0 (Flink 1.19.0) is the newest whose
dependencies all resolve, and the 2.77 SDK runs on it (the Job and Fn APIs are versioned
protocols). Memory is sized for a 24 GB machine: 1 GB JobManager, 2 GB per TaskManager (the
Python workers, which hold the models, are processes of their own outside it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINE = ROOT / ".engines" / "flink"
CLUSTER = ENGINE / "cluster"
JOB_SERVER_JAR = ENGINE / "beam-runners-flink-1.19-job-server-2.62.0.jar"
# a job of this cluster ships none of the runner's jars, which its TaskManagers hold (StageNoJars.java)
STAGE_NO_JARS_SOURCE = HERE / "StageNoJars.java"
STAGE_NO_JARS_JAR = ENGINE / "specrag-stage-no-jars.jar"
STAGE_NO_JARS = "specrag.flink.StageNoJars"
CLASSPATH = ENGINE / "classpath.txt"
FLINK_VERSION = "1.19"
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
JOB_MANAGER_MAIN = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASK_MANAGER_MAIN = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
# Flink's own start scripts add these on Java 17 (env.java.opts.all in its default config)
JAVA_OPTS = ["--add-exports=java.base/sun.net.util=ALL-UNNAMED", "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
             "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED"] + [
    f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.lang", "java.net", "java.io", "java.nio", "sun.nio.ch", "java.lang.reflect", "java.text", "java.time",
        "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "java.util.concurrent.locks")]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class JarSet:
    """A pinned set of jars: a pom's dependencies resolved from Maven Central by Maven
    (``dependency:build-classpath``; nothing is built) into ``~/.m2``, each jar checked against
    the pom's sha256 file, the classpath kept in ``.engines/flink``. ``install`` is idempotent."""

    def __init__(self, name: str, pom: Path, pins: Path, classpath: Path):
        self.name, self.pom, self.pins, self.classpath_file = name, pom, pins, classpath

    def _stamp(self) -> Path:
        return self.classpath_file.with_suffix(".installed")

    def _key(self) -> str:
        return hashlib.sha256(self.pom.read_bytes() + self.pins.read_bytes()).hexdigest()

    def installed(self) -> bool:
        stamp = self._stamp()
        return stamp.is_file() and stamp.read_text() == self._key() and self.classpath_file.is_file()

    def install(self, quiet: bool = True) -> list[Path]:
        if self.installed():
            return self.jars()
        if not shutil.which("mvn") or not shutil.which("java"):
            raise SystemExit(f"{self.name}: needs Java 17 and Maven (apt-get install openjdk-17-jdk-headless maven)")
        self.classpath_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["mvn", "-B", "-ntp", "--strict-checksums", "-f", str(self.pom), "dependency:build-classpath",
               f"-Dmdep.outputFile={self.classpath_file}"]
        done = subprocess.run(cmd + (["-q"] if quiet else []), capture_output=quiet, text=True)
        if done.returncode:
            tail = (done.stdout or "").strip().splitlines()[-3:]
            raise SystemExit(f"{self.name}: Maven could not resolve the pinned jars: {' '.join(tail)}")
        self.verify(self.jars())
        self._stamp().write_text(self._key())
        return self.jars()

    def jars(self) -> list[Path]:
        return [Path(p) for p in self.classpath_file.read_text().strip().split(os.pathsep)]

    def classpath(self) -> str:
        if not self.installed():
            raise SystemExit(f"{self.name}: not installed; run `python {Path(sys.argv[0]).name} install`")
        return self.classpath_file.read_text().strip()

    def verify(self, jars: list[Path]) -> None:
        """Each jar of the resolved classpath is the pinned one (sha256), none missing or extra."""
        pinned = {}
        for line in self.pins.read_text().splitlines():
            digest, rel = line.split()
            pinned[rel] = digest
        seen = set()
        for jar in jars:
            rel = next((r for r in pinned if jar.as_posix().endswith("/" + r)), None)
            if rel is None:
                raise SystemExit(f"{self.name}: {jar} is not among the pinned jars ({self.pins})")
            if _sha256(jar) != pinned[rel]:
                raise SystemExit(f"{self.name}: {jar} does not match its pinned sha256; delete it and install again")
            seen.add(rel)
        missing = sorted(set(pinned) - seen)
        if missing:
            raise SystemExit(f"{self.name}: the resolved classpath lacks pinned jars: {', '.join(missing[:3])}")


def manifest_jar(path: Path, main_class: str, jars: list[Path]) -> Path:
    """A jar that is only a manifest over ``jars`` (Beam's runner starts its job server with
    ``java -jar``)."""
    header = "Class-Path: " + " ".join(j.as_uri() for j in jars)
    lines, rest = [header[:72]], header[72:]
    while rest:  # manifest lines are at most 72 bytes; a continuation starts with a space
        lines.append(" " + rest[:71])
        rest = rest[71:]
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF",
                     "\r\n".join(["Manifest-Version: 1.0", f"Main-Class: {main_class}", *lines]) + "\r\n")
    return path


FLINK = JarSet("flink engine", HERE / "pom.xml", HERE / "jars.sha256", CLASSPATH)


def build_stage_no_jars(jars: list[Path]) -> Path | None:
    """``StageNoJars.java`` compiled against the pinned Beam SDK into a jar for the job server's
    classpath (rebuilt when the source changes); None, with a line saying so, without a JDK's
    ``javac``: jobs then ship the runner's jars as Beam does by default, only slower."""
    stamp = STAGE_NO_JARS_JAR.with_suffix(".sha256")
    key = _sha256(STAGE_NO_JARS_SOURCE)
    if STAGE_NO_JARS_JAR.is_file() and stamp.is_file() and stamp.read_text() == key:
        return STAGE_NO_JARS_JAR
    if not shutil.which("javac"):
        print("flink engine: no javac (a JDK) on the PATH: each job will ship the runner's jars (~14 s a job)")
        return None
    core = next(j for j in jars if j.name.startswith("beam-sdks-java-core-"))
    with tempfile.TemporaryDirectory() as classes:
        subprocess.run(["javac", "--release", "11", "-d", classes, "-cp", str(core), str(STAGE_NO_JARS_SOURCE)],
                       check=True, capture_output=True, text=True)
        with zipfile.ZipFile(STAGE_NO_JARS_JAR, "w") as jar:
            for path in sorted(Path(classes).rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
    stamp.write_text(key)
    return STAGE_NO_JARS_JAR


def install(quiet: bool = True) -> Path:
    """Resolve and check the engine's jars; returns the job server's jar. Idempotent."""
    jars = FLINK.install(quiet)
    extra = build_stage_no_jars(jars)
    wanted = [*jars, *([extra] if extra else [])]
    if JOB_SERVER_JAR.is_file() and _manifest_class_path(JOB_SERVER_JAR) == [j.as_uri() for j in wanted]:
        return JOB_SERVER_JAR
    return manifest_jar(JOB_SERVER_JAR, JOB_SERVER_MAIN, wanted)


def _manifest_class_path(jar: Path) -> list[str]:
    with zipfile.ZipFile(jar) as z:
        text = z.read("META-INF/MANIFEST.MF").decode().replace("\r\n ", "")
    line = next((ln for ln in text.split("\r\n") if ln.startswith("Class-Path: ")), "Class-Path: ")
    return line[len("Class-Path: "):].split()


def stages_no_jars() -> bool:
    """Whether the installed job server holds ``StageNoJars`` (what `install` built)."""
    return JOB_SERVER_JAR.is_file() and STAGE_NO_JARS_JAR.as_uri() in _manifest_class_path(JOB_SERVER_JAR)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_java(folder: Path, name: str, args: list[str], env: dict[str, str],
               processes: dict[str, subprocess.Popen]) -> subprocess.Popen:
    """One JVM of a local service, in a session of its own (a kill takes what it started), its
    output in ``folder/log/<name>.log``, registered in ``processes`` under ``name``."""
    log = (folder / "log" / f"{name}.log").open("ab")
    proc = subprocess.Popen(["java", *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=folder)
    processes[name] = proc
    return proc


def kill(processes: dict[str, subprocess.Popen], name: str) -> None:
    proc = processes.pop(name)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_all(processes: dict[str, subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM to each process group, SIGKILL to one still there after ``timeout``."""
    for name in list(processes):
        proc = processes.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def stop_recorded(state: Path, not_running: str, timeout: float = 30) -> None:
    """`stop` of a detached start: SIGTERM to each process group its state file records, and a
    wait (up to ``timeout``) for them to go, so that their files can be removed after."""
    if not state.is_file():
        raise SystemExit(not_running)
    pids = list(json.loads(state.read_text())["pids"].values())
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + timeout
    while pids and time.time() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.2)
    state.unlink()


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def scratch(folder: Path) -> Path:
    """A cluster's temporary files (every JVM's ``java.io.tmpdir`` and Flink's ``io.tmp.dirs``):
    inside its folder, so that stopping it removes them."""
    return folder / "tmp"


class Cluster:
    """A JobManager, ``taskmanagers`` TaskManagers and a Beam job server, each its own JVM,
    bound to 127.0.0.1, with their configuration and logs in ``folder``."""

    def __init__(self, folder: Path = CLUSTER, taskmanagers: int = 2, slots: int = 1, rest_port: int = 0,
                 job_port: int = 0, env: dict[str, str] | None = None):
        self.folder, self.taskmanagers, self.slots = Path(folder), taskmanagers, slots
        self.rest_port, self.job_port = rest_port or free_port(), job_port or free_port()
        self.env = dict(os.environ if env is None else env)
        self.processes: dict[str, subprocess.Popen] = {}
        self._tm_flags: tuple[list[str], list[str]] | None = None
        self._tm_ports: dict[str, int] = {}  # each TaskManager's RPC port, this start's
        self._classpath = CLASSPATH.read_text().strip() if CLASSPATH.is_file() else ""
        self._stage_no_jars = False  # what the job server started with holds (start)
        self.scratch = scratch(self.folder)

    # -- configuration ------------------------------------------------------------------
    def write_config(self) -> Path:
        conf = self.folder / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        settings = {
            "jobmanager.rpc.address": "127.0.0.1", "jobmanager.rpc.port": free_port(),
            "jobmanager.bind-host": "127.0.0.1", "jobmanager.memory.process.size": "1024m",
            "taskmanager.bind-host": "127.0.0.1", "taskmanager.host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": self.slots, "taskmanager.memory.process.size": "2048m",
            # Beam's batch translation runs many shuffling tasks at once in a slot (build-index
            # needed 512 buffers more than a 1.5 GB TaskManager's default network share)
            "taskmanager.memory.network.min": "256m", "taskmanager.memory.network.max": "256m",
            "taskmanager.memory.managed.size": "64m",
            "rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1", "rest.port": self.rest_port,
            "blob.server.port": free_port(), "parallelism.default": 1,
            # a killed TaskManager fails its job at once (the run is then resumed), not after 50 s
            "heartbeat.timeout": 15000, "restart-strategy.type": "none",
            # Beam's runner is on the TaskManagers' classpath and in each job's jar: child-first
            # loading split its vendored gRPC across two loaders (IllegalAccessError in the logs)
            "classloader.resolve-order": "parent-first",
            # each TaskManager's working folder keeps every job's jars (~150 MB a job) for an hour
            # and a killed one never removes it: in /tmp, a day of tests left tens of GB
            "io.tmp.dirs": str(self.scratch),
        }
        (conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
        return conf

    def _java(self, name: str, args: list[str]) -> subprocess.Popen:
        self.scratch.mkdir(parents=True, exist_ok=True)
        return start_java(self.folder, name, [f"-Djava.io.tmpdir={self.scratch}", *args], self.env, self.processes)

    def _taskmanager_flags(self, conf: Path) -> tuple[list[str], list[str]]:
        """The JVM flags and the ``-D`` memory settings Flink's scripts compute for a TaskManager."""
        out = subprocess.run(["java", "-cp", self._classpath, "org.apache.flink.runtime.util.bash.BashJavaUtils",
                              "GET_TM_RESOURCE_PARAMS", "--configDir", str(conf)],
                             capture_output=True, text=True, check=True).stdout
        result = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
        return result[0].split(), result[1].split()

    def start_taskmanager(self, name: str | None = None) -> str:
        """Start a TaskManager (again, after a kill, under its old ``name``). Its resource id is
        its name, so a restarted one replaces the dead one's registration at once (a job
        submitted meanwhile was given the dead one's slots and failed); its RPC port is fresh, so
        `wait_for` knows the new registration from the old."""
        conf = self.folder / "conf"
        if self._tm_flags is None:
            self._tm_flags = self._taskmanager_flags(conf)
        jvm, dynamic = self._tm_flags
        name = name or f"taskmanager-{sum(n.startswith('taskmanager') for n in self.processes) + 1}"
        self._tm_ports[name] = free_port()
        self._java(name, [*JAVA_OPTS, *jvm, "-cp", self._classpath, TASK_MANAGER_MAIN, "--configDir", str(conf),
                          *dynamic, "-D", f"taskmanager.resource-id={name}",
                          "-D", f"taskmanager.rpc.port={self._tm_ports[name]}"])
        return name

    def start(self, timeout: float = 120) -> "Cluster":
        if not self._classpath:
            raise SystemExit("flink engine: not installed; run `python deploy/flink/launch.py install`")
        (self.folder / "log").mkdir(parents=True, exist_ok=True)
        conf = self.write_config()
        self._java("jobmanager", [*JAVA_OPTS, "-Xmx700m", "-cp", self._classpath, JOB_MANAGER_MAIN,
                                  "--configDir", str(conf)])
        for _ in range(self.taskmanagers):
            self.start_taskmanager()
        self._stage_no_jars = stages_no_jars()
        # its log lines with their time (slf4j-simple's default has none)
        timed = ["-Dorg.slf4j.simpleLogger.showDateTime=true", "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"]
        self._java("jobserver", ["-Xmx512m", *timed, "-jar", str(JOB_SERVER_JAR), "--job-host", "127.0.0.1",
                                 "--job-port", str(self.job_port), "--artifact-port", "0", "--expansion-port", "0",
                                 "--flink-master", f"http://127.0.0.1:{self.rest_port}",
                                 "--artifacts-dir", str(self.folder / "artifacts"), "--clean-artifacts-per-job"])
        self.wait_for(self.taskmanagers, timeout)
        deadline = time.time() + timeout
        while not _listening(self.job_port):
            self._check_alive()
            if time.time() > deadline:
                raise RuntimeError(f"the Beam job server did not listen within {timeout:.0f} s; see {self.folder}/log")
            time.sleep(0.3)
        (self.folder / "cluster.json").write_text(json.dumps(self.describe(), indent=2))
        return self

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None and name in ("jobmanager", "jobserver"):
                raise RuntimeError(f"Flink's {name} exited ({proc.returncode}); see {self.folder}/log/{name}.log")

    def overview(self) -> dict:
        return self._rest("/overview")

    def wait_for(self, taskmanagers: int, timeout: float = 120) -> dict:
        """Wait until ``taskmanagers`` of the TaskManagers running now are registered with the
        JobManager, each by its current process (not a killed one's registration still there)."""
        deadline = time.time() + timeout
        while True:
            self._check_alive()
            try:
                if self._registered() >= taskmanagers:
                    return self.overview()
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"Flink did not register {taskmanagers} TaskManagers in {timeout:.0f} s; "
                                   f"see {self.folder}/log")
            time.sleep(0.5)

    def _registered(self) -> int:
        found = {tm["id"]: tm["path"] for tm in self._rest("/taskmanagers")["taskmanagers"]}
        return sum(name in found and f":{port}/" in found[name] for name, port in self._tm_ports.items()
                   if name in self.processes and self.processes[name].poll() is None)

    def kill(self, name: str) -> None:
        """SIGKILL one process of the cluster (a TaskManager, say): no clean-up of its own."""
        kill(self.processes, name)

    def busy_taskmanagers(self) -> list[str]:
        """The TaskManagers (by name) running a subtask of a running job now. A kill meant to fail
        a job must hit one of these: a batch job's keys split unevenly, so one TaskManager may
        have finished its share while the other still writes."""
        busy: set[str] = set()
        for job in self._rest("/jobs")["jobs"]:
            if job["status"] != "RUNNING":
                continue
            for vertex in self._rest(f"/jobs/{job['id']}")["vertices"]:
                if vertex["status"] == "RUNNING":
                    found = self._rest(f"/jobs/{job['id']}/vertices/{vertex['id']}/taskmanagers")["taskmanagers"]
                    busy.update(tm["taskmanager-id"] for tm in found if tm["status"] == "RUNNING")
        return sorted(busy & set(self.processes))

    def _rest(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        stop_all(self.processes)
        (self.folder / "cluster.json").unlink(missing_ok=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def describe(self) -> dict:
        return {"rest": f"http://127.0.0.1:{self.rest_port}", "job_endpoint": f"127.0.0.1:{self.job_port}",
                "parallelism": self.taskmanagers * self.slots, "stage_no_jars": self._stage_no_jars,
                "pids": {name: proc.pid for name, proc in self.processes.items()}}

    def flags(self, worker: str | None = None) -> list[str]:
        return job_flags(self.describe(), worker)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *_) -> None:
        self.stop()


def default_worker() -> str:
    """specrag-worker beside this Python, else this checkout's .venv's, else the PATH's."""
    for candidate in (Path(sys.executable).with_name("specrag-worker"), ROOT / ".venv" / "bin" / "specrag-worker"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("specrag-worker")
    if not found:
        raise SystemExit("no specrag-worker found: install specrag (make install) or pass --worker")
    return found


def job_flags(described: dict, worker: str | None = None) -> list[str]:
    """The Beam flags that run a job on the cluster: Beam's FlinkRunner through the cluster's job
    server, parallelism = the slots, each SDK worker started by ``specrag-worker``, and no jar
    shipped with the job where the job server can leave them out (`install` built StageNoJars)."""
    worker = worker or default_worker()
    # --flink_master: where a streaming job is cancelled (Beam's portable cancel leaves it running)
    flags = ["--runner=FlinkRunner", f"--job_endpoint={described['job_endpoint']}",
             f"--flink_master={described['rest'].split('://', 1)[1]}",
             f"--parallelism={described['parallelism']}", "--environment_type=PROCESS",
             "--environment_config=" + json.dumps({"command": worker}, separators=(",", ":"))]
    if described.get("stage_no_jars"):
        flags.append(f"--pipeline_resources_detector_factory_class={STAGE_NO_JARS}")
    return flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="resolve and check the engine's jars (idempotent)")
    start = sub.add_parser("start", help="start a detached session cluster and its job server")
    start.add_argument("--taskmanagers", type=int, default=2)
    start.add_argument("--slots", type=int, default=1)
    start.add_argument("--rest-port", type=int, default=8081)
    start.add_argument("--job-port", type=int, default=8099)
    sub.add_parser("stop", help="stop the cluster `start` started")
    flags = sub.add_parser("flags", help="print the flags that run a specrag job on the running cluster")
    flags.add_argument("--worker", help="the specrag-worker command on the TaskManagers' machine")
    for command in (start, sub.choices["stop"], flags):
        command.add_argument("--folder", type=Path, default=CLUSTER, help="the cluster's configuration and logs")
    args = parser.parse_args(argv)
    state = args.folder / "cluster.json" if args.command != "install" else None
    if args.command == "install":
        print(install(quiet=False))
    elif args.command == "start":
        if state.is_file():
            raise SystemExit(f"a cluster is running (see {state}); `launch.py stop` first")
        install()
        cluster = Cluster(args.folder, args.taskmanagers, args.slots, args.rest_port, args.job_port).start()
        print(f"Flink {FLINK_VERSION} on http://127.0.0.1:{cluster.rest_port} with {args.taskmanagers} TaskManagers; "
              f"jobs: specrag ... {' '.join(cluster.flags())}")
    elif args.command == "stop":
        stop_recorded(state, "no cluster is running")
        shutil.rmtree(scratch(args.folder), ignore_errors=True)
    elif args.command == "flags":
        if not state.is_file():
            raise SystemExit("no cluster is running: `python deploy/flink/launch.py start`")
        print(" ".join(job_flags(json.loads(state.read_text()), args.worker)))  # no spaces: $(...) splits it
    return 0


if __name__ == "__main__":
    sys.exit(main())
