"""Runs fulgur's MLFlowLogger against a real MLflow and reads each run back with MLflow's MlflowClient.

    python check_mlflow.py server-start DIR          start `mlflow server` (sqlite, artifacts served), wait for it
    python check_mlflow.py server-stop DIR           stop it
    python check_mlflow.py rest_run DIR --server S --program P     a run logged over REST, read back
    python check_mlflow.py server_late DIR --server S --program P  the server reachable only after the run began
    python check_mlflow.py server_slow DIR --server S --program P  the first runs/create times out, yet lands
    python check_mlflow.py fit DIR --server S --program P          a Trainer fit (tests/loggers/mlflow_fit.cpp)
    python check_mlflow.py file_store DIR --program P              MLflow's file store, written without a server

P is fulgur_mlflow_tests (its hidden "[.scenario]" test case logs the run) or fulgur_mlflow_fit. Every
problem is printed; the exit status is 1 if there is one.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

try:
    import mlflow  # noqa: F401
    from mlflow.tracking import MlflowClient
except ImportError:
    print("mlflow is not installed in this Python (" + sys.executable + "): run scripts/setup.sh, which installs "
          "the pinned mlflow into the project's venv.")
    sys.exit(1)

problems = []
STEPS = 1200


def expect(condition, text):
    if not condition:
        problems.append(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_start(folder):
    folder = pathlib.Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    port = free_port()
    log = open(folder / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder}/mlflow.db", "--artifacts-destination", str(folder / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (folder / "server.json").write_text(json.dumps({"pid": process.pid, "port": port, "url": f"http://127.0.0.1:{port}"}))
    deadline = time.time() + 80
    while time.time() < deadline:
        if process.poll() is not None:
            print("mlflow server ended at start:\n" + (folder / "server.log").read_text()[-3000:])
            return 1
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                if answer.status == 200:
                    print(f"mlflow server up on port {port}")
                    return 0
        except OSError:
            time.sleep(0.25)
    print("mlflow server did not answer within 80 s:\n" + (folder / "server.log").read_text()[-3000:])
    os.killpg(process.pid, signal.SIGKILL)
    return 1


def server_stop(folder):
    info = pathlib.Path(folder) / "server.json"
    if not info.exists():
        return 0
    pid = json.loads(info.read_text())["pid"]
    try:
        os.killpg(pid, signal.SIGTERM)  # the session start_new_session gave it: the server and its workers
        for _ in range(12):  # uvicorn's graceful shutdown can take long; the data is in sqlite already
            os.killpg(pid, 0)
            time.sleep(0.25)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    info.unlink()
    return 0


class LateProxy:
    """Forwards a port to the server, but listens only from open() on: until then the port refuses.
    With hold_create, the first runs/create reaches the server only after `hold_create` seconds (the
    client has timed out by then), and connections made meanwhile are closed at once."""

    def __init__(self, target_port, hold_create=0.0):
        self.port, self.target, self.hold_create = free_port(), target_port, hold_create
        self.holding = threading.Event()

    def open(self):
        listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener):
        while True:
            client, _ = listener.accept()
            if self.holding.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink):
        try:
            while data := source.recv(65536):
                if self.hold_create and b"/runs/create" in data:
                    self.hold_create, held = 0.0, self.hold_create
                    self.holding.set()
                    time.sleep(held)
                    sink.sendall(data)
                    time.sleep(1.0)  # the server has created the run by then
                    self.holding.clear()
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def read_report(folder):
    report = {"warning": []}
    for line in (pathlib.Path(folder) / "report.txt").read_text().splitlines():
        key, _, value = line.partition("=")
        if key in ("warning", "kept"):
            report.setdefault(key, []).append(value)
        else:
            report[key] = value
    return report


def run_scenario(program, folder, uri, mode, status="success", sleep_ms=0, steps=STEPS, timeout_ms=15000):
    environment = dict(os.environ, FULGUR_MLFLOW_URI=uri, FULGUR_MLFLOW_OUT=str(folder), FULGUR_MLFLOW_MODE=mode,
                       FULGUR_MLFLOW_STATUS=status, FULGUR_MLFLOW_SLEEP_MS=str(sleep_ms), FULGUR_MLFLOW_STEPS=str(steps),
                       FULGUR_MLFLOW_TIMEOUT_MS=str(timeout_ms))
    return subprocess.Popen([program, "[.scenario]"], env=environment)


def check_scenario_run(client, report, mode, status):
    run = client.get_run(report["run_id"])
    expect(run.info.status == status, f"run status {run.info.status}, expected {status}")
    expect(run.info.run_name == f"run-{mode}", f"run name {run.info.run_name}")
    expect(client.get_experiment(run.info.experiment_id).name == f"fulgur-{mode}", "experiment name")
    params = run.data.params
    expected = {"lr": "0.001", "batch_size": "32", "nesterov": "True", "name": "mlp", "long": "x" * 250,
                "tiny": "1e-05", "model/hidden": "128"}
    expect(params == expected, f"params {params}")
    tags = run.data.tags
    expect(tags.get("team") == "fulgur", f"tag team: {tags.get('team')}")
    expect(tags.get("mlflow.runName") == f"run-{mode}", f"tag mlflow.runName: {tags.get('mlflow.runName')}")
    expect(tags.get("mlflow.source.type") == "LOCAL" and tags.get("mlflow.user"), f"context tags: {tags}")
    expected_metrics = {"train_loss": lambda s: 1.0 / (s + 1), "lr-SGD": lambda s: 0.1 * s, "val/acc1": lambda s: s * 0.5}
    expect(set(run.data.metrics) == set(expected_metrics), f"metric keys {sorted(run.data.metrics)}")
    for key, value_at in expected_metrics.items():
        history = sorted(client.get_metric_history(report["run_id"], key), key=lambda m: m.step)
        expect([m.step for m in history] == list(range(STEPS)), f"{key}: steps {len(history)} values, "
               f"first {[m.step for m in history[:3]]}")
        wrong = [(m.step, m.value) for m in history if m.value != value_at(m.step)]
        expect(not wrong, f"{key}: values differ at {wrong[:3]}")
    artifacts = {a.path for a in client.list_artifacts(report["run_id"], "epoch=0-step=10")}
    expect(artifacts == {"epoch=0-step=10/epoch=0-step=10.ckpt", "epoch=0-step=10/metadata.yaml",
                         "epoch=0-step=10/aliases.txt"}, f"checkpoint artifacts {artifacts}")
    local = client.download_artifacts(report["run_id"], "epoch=0-step=10", dst_path=str(report["dir"] / "download"))
    expect(pathlib.Path(local, "epoch=0-step=10.ckpt").read_text() == "fulgur-checkpoint", "checkpoint content")
    expect(pathlib.Path(local, "aliases.txt").read_text() == "['latest', 'best']", "aliases.txt")
    expect("score: 0.25" in pathlib.Path(local, "metadata.yaml").read_text(), "metadata.yaml score")
    last = {a.path for a in client.list_artifacts(report["run_id"], "last")}
    expect("last/last.ckpt" in last, f"last.ckpt artifacts {last}")
    renamed = [w for w in report["warning"] if "Replacing val/acc@1 with val/acc1." in w]
    expect(len(renamed) == 1, f"one warning for the renamed metric, got {report['warning']}")
    overridden = [w for w in report["warning"] if "The tag mlflow.runName is found in tags" in w]
    expect(len(overridden) == 1, f"one warning for the run name replacing the tag, got {report['warning']}")
    expect(report.get("unsent") == "0" and report.get("dropped") == "0", f"unsent/dropped {report}")


def scenario(args, mode, uri, status="success", late=None, timeout_ms=15000):
    folder = pathlib.Path(args.folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    began = time.time()
    process = run_scenario(args.program, folder, uri, mode, status, sleep_ms=2 if late else 0, timeout_ms=timeout_ms)
    if late:
        time.sleep(1.5)  # the program has logged for a while to a port that refuses
        expect(process.poll() is None, "the program ended before the server came")
        late.open()
    code = process.wait(timeout=100)
    expect(code == 0, f"the scenario program failed ({code})")
    if code != 0:
        return
    report = read_report(folder)
    report["dir"] = folder
    print(f"{mode}: logged in {time.time() - began:.1f} s, run {report.get('run_id')}")
    return report


def tracking(args):
    return json.loads((pathlib.Path(args.server) / "server.json").read_text())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("folder")
    parser.add_argument("--server")
    parser.add_argument("--program")
    args = parser.parse_args()
    if args.command == "server-start":
        return server_start(args.folder)
    if args.command == "server-stop":
        return server_stop(args.folder)
    if args.command == "rest_run":
        url = tracking(args)["url"]
        if report := scenario(args, "rest", url, status="failed"):
            check_scenario_run(MlflowClient(url), report, "rest", "FAILED")
            expect(len(report["warning"]) == 2, f"warnings: {report['warning']}")
    elif args.command == "server_late":
        server = tracking(args)
        proxy = LateProxy(server["port"])
        if report := scenario(args, "late", f"http://127.0.0.1:{proxy.port}", status="interrupted", late=proxy):
            check_scenario_run(MlflowClient(server["url"]), report, "late", "KILLED")
            outage = [w for w in report["warning"] if "does not answer" in w]
            expect(len(outage) == 1, f"one warning for the outage, got {report['warning']}")
            expect(len(report["warning"]) == 3, f"warnings: {report['warning']}")
    elif args.command == "server_slow":
        server = tracking(args)
        proxy = LateProxy(server["port"], hold_create=2.0)
        proxy.open()
        if report := scenario(args, "slow", f"http://127.0.0.1:{proxy.port}", timeout_ms=1000):
            client = MlflowClient(server["url"])
            check_scenario_run(client, report, "slow", "FINISHED")
            experiment = client.get_experiment_by_name("fulgur-slow")
            key = client.get_run(report["run_id"]).data.tags.get("fulgur.run_key")
            runs = client.search_runs([experiment.experiment_id], f"tags.`fulgur.run_key` = '{key}'")
            expect(len(runs) == 1, f"the create that timed out left {len(runs)} runs, expected 1")
            # The held runs/create is one outage, said once however often it is retried. A busy machine may
            # time out a later request too (a second outage, said once of its own), so only the create's count.
            held = [w for w in report["warning"] if "does not answer (runs/create" in w and "timed out" in w]
            expect(len(held) == 1, f"one warning for the held runs/create, got {report['warning']}")
    elif args.command == "file_store":
        store = pathlib.Path(args.folder) / "mlruns"
        if report := scenario(args, "file", "file:" + str(store)):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3 reads file stores only when asked
            check_scenario_run(MlflowClient(tracking_uri="file:" + str(store)), report, "file", "FINISHED")
            expect(len(report["warning"]) == 2, f"warnings: {report['warning']}")
            run_dir = pathlib.Path(report["log_dir"])
            expect(run_dir.parent.parent == store, f"log_dir {run_dir} is not <store>/<experiment>/<run>")
            first = (run_dir / "metrics" / "train_loss").read_text().splitlines()[0].split(" ")
            expect(len(first) == 3 and first[1:] == ["1.0", "0"], f"metrics line {first}")
    elif args.command == "fit":
        check_fit(args)
    else:
        print(f"unknown command {args.command}")
        return 2
    for problem in problems:
        print("PROBLEM:", problem)
    if not problems:
        print(f"{args.command}: the run read back with MlflowClient is as logged")
    return 1 if problems else 0


def check_fit(args):
    url = tracking(args)["url"]
    folder = pathlib.Path(args.folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    code = subprocess.run([args.program, url, str(folder)], timeout=100).returncode
    expect(code == 0, f"the fit program failed ({code})")
    if code != 0:
        return
    report = read_report(folder)
    client = MlflowClient(url)
    run = client.get_run(report["run_id"])
    expect(run.info.status == "FINISHED", f"status {run.info.status}")
    expect(run.data.params == {"lr": "0.1", "hidden": "16", "optimizer": "sgd"}, f"params {run.data.params}")
    expect(run.data.tags.get("mlflow.runName") == "mlp", "run name")
    steps = int(report["global_step"])
    train = client.get_metric_history(report["run_id"], "train_loss")
    expect([m.step for m in train] == list(range(3, steps, 4)), f"train_loss steps {[m.step for m in train]}")
    val = client.get_metric_history(report["run_id"], "val_loss")
    expect(len(val) == 3, f"val_loss: {len(val)} values")
    expect("epoch" in run.data.metrics, f"metrics {sorted(run.data.metrics)}")
    expect(pathlib.Path(report["log_dir"]).parent.name == run.info.experiment_id, f"log_dir {report['log_dir']}")
    kept = sorted(pathlib.Path(p).name for p in report.get("kept", []))
    expect(len(kept) == 2, f"kept checkpoints {kept}")
    for name in kept:
        stem = name[: -len(".ckpt")]
        listed = {a.path for a in client.list_artifacts(report["run_id"], stem)}
        expect(f"{stem}/{name}" in listed, f"checkpoint {name} not among the artifacts: {listed}")
        # The Trainer tells the logger which file is best, with the scores (Lightning's after_save_checkpoint).
        local = client.download_artifacts(report["run_id"], stem, dst_path=str(folder / "download"))
        best = pathlib.Path(report["best"]).name == name
        aliases = pathlib.Path(local, "aliases.txt").read_text()
        expect(aliases == ("['latest', 'best']" if best else "['latest']"), f"{name}: aliases {aliases}")
        expect("score: null" not in pathlib.Path(local, "metadata.yaml").read_text(), f"{name}: no score in metadata")
    expect(not report["warning"], f"warnings: {report['warning']}")


if __name__ == "__main__":
    sys.exit(main())
