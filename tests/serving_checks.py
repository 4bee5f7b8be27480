"""The serving side of tests/test_serving.py and benchmarks/bench_serving.py: run with the python of
a serving venv (build/serve-venvs/NAME/venv), never imported by pytest itself; torch is not needed
(the Triton venv has none). Each command writes one JSON object to OUT.json.

    python tests/serving_checks.py triton-config MODEL_DIR CASE_DIR OUT.json
    python tests/serving_checks.py triton-serve MODEL_DIR CASE_DIR OUT.json [--requests N] [--concurrency C]
                                   [--instances K] [--warmup W]
    python tests/serving_checks.py ray CASE_DIR OUT.json [--replicas N] [--requests N] [--concurrency C]
                                   [--kill-after K] [--warmup W]

MODEL_DIR: a model of a repository written by ``opforge triton-repo``. CASE_DIR: model.onnx,
images.npy (K, C, H, W) and expected.npy (torch's outputs for them). Request j sends
``request_images(j)``: 1 to 3 images, so the servers batch requests of several sizes; every answer
is compared with torch's outputs for its own images.

The deployment code is the documentation's: ``doc_code(marker)`` runs the ```py block of
docs/serving.md that holds ``marker`` (the Ray Serve deployment class; the pytriton binding).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import secrets
import socket
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def doc_code(marker: str) -> dict:
    """The namespace of the ```py block of docs/serving.md that contains ``marker``."""
    blocks = [b for b in re.findall(r"^```py\n(.*?)^```", DOCS.read_text(), re.S | re.M) if marker in b]
    if len(blocks) != 1:
        raise LookupError(f"docs/serving.md: {len(blocks)} ```py blocks hold {marker!r}; expected one")
    namespace = {"__name__": "opforge_serving_docs"}  # not importable: Ray ships the class by value
    exec(compile(blocks[0], f"{DOCS}:{marker}", "exec"), namespace)
    return namespace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the requests ---------------------------------------------------------------------------------------

class Case:
    def __init__(self, case_dir: Path):
        self.dir = case_dir
        self.images = np.load(case_dir / "images.npy")
        self.expected = np.load(case_dir / "expected.npy")

    def request_images(self, j: int) -> tuple[int, int]:
        """(start, count) of request j's images: 1, 2 or 3 of them, from a place that moves."""
        count = 1 + j % 3
        start = (7 * j) % (len(self.images) - 2)
        return start, count


def run_load(send, case: Case, requests: int, concurrency: int, stop: threading.Event | None = None,
             records: list | None = None) -> dict:
    """Calls of ``send(images) -> (outputs, meta dict)`` from ``concurrency`` threads, each answer
    compared with torch's outputs for its images: ``requests`` of them, or fewer if ``stop`` is set
    first (a bounded loop either way). Every record has its request's index and end time; they are
    appended to ``records`` as they come (a caller in another thread can watch it)."""
    lock = threading.Lock()
    next_index = [0]
    records = [] if records is None else records

    def worker():
        while True:
            with lock:
                j = next_index[0]
                if j >= requests or (stop is not None and stop.is_set()):
                    return
                next_index[0] += 1
            start, count = case.request_images(j)
            t0 = time.perf_counter()
            try:
                out, meta = send(case.images[start:start + count])
                want = case.expected[start:start + count]
                err = float(np.abs(out - want).max()) if out.shape == want.shape else float("inf")
                record = {"ok": True, "max_abs_err": err, **meta}
            except Exception as exc:  # noqa: BLE001 - a failed request is counted, not raised
                record = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            record.update(index=j, images=count, seconds=time.perf_counter() - t0, end=time.perf_counter())
            with lock:
                records.append(record)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return load_summary(records, wall, concurrency) | {"records": sorted(records, key=lambda r: r["index"])}


def load_summary(records: list, wall: float, concurrency: int) -> dict:
    ok = [r for r in records if r["ok"]]
    return {"requests": len(records), "concurrency": concurrency, "ok": len(ok), "failed": len(records) - len(ok),
            "errors": sorted({r["error"] for r in records if not r["ok"]})[:5],
            "max_abs_err": max((r["max_abs_err"] for r in ok), default=None),
            "wall_s": wall, "requests_per_s": len(ok) / wall, "images_per_s": sum(r["images"] for r in ok) / wall,
            "median_latency_ms": 1e3 * float(np.median([r["seconds"] for r in ok])) if ok else None}


def _summary(load: dict) -> dict:
    return {k: v for k, v in load.items() if k != "records"}


# ---- Triton: the written repository -----------------------------------------------------------------------

def read_config(model_dir: Path):
    """config.pbtxt parsed with Triton's own ModelConfig message (tritonclient's model_config_pb2)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def backend_session(model_dir: Path, config, threads: int = 1):
    """An ONNX Runtime session made as Triton's onnxruntime backend makes one for a model instance:
    each ``model_operations.op_library_filename`` registered as written, then ``1/model.onnx``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for path in config.model_operations.op_library_filename:
        options.register_custom_ops_library(path)
    return ort.InferenceSession(str(model_dir / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"])


NUMPY_TYPES = {"TYPE_FP32": np.float32, "TYPE_FP64": np.float64, "TYPE_FP16": np.float16, "TYPE_INT64": np.int64,
               "TYPE_INT32": np.int32, "TYPE_INT8": np.int8, "TYPE_UINT8": np.uint8, "TYPE_BOOL": np.bool_}
ORT_TYPES = {"TYPE_FP32": "tensor(float)", "TYPE_FP64": "tensor(double)", "TYPE_FP16": "tensor(float16)",
             "TYPE_INT64": "tensor(int64)", "TYPE_INT32": "tensor(int32)", "TYPE_INT8": "tensor(int8)",
             "TYPE_UINT8": "tensor(uint8)", "TYPE_BOOL": "tensor(bool)"}


def triton_config_check(model_dir: Path, case: Case) -> dict:
    import onnxruntime as ort
    from tritonclient.grpc import model_config_pb2

    config = read_config(model_dir)
    type_name = model_config_pb2.DataType.Name
    session = backend_session(model_dir, config)
    batch = [-1] if config.max_batch_size > 0 else []

    def io(config_tensors, ort_tensors):
        return {"config": [[t.name, type_name(t.data_type), batch + list(t.dims)] for t in config_tensors],
                "session": [[t.name, t.type, [d if isinstance(d, int) else -1 for d in t.shape]] for t in ort_tensors],
                "types_agree": all(ORT_TYPES.get(type_name(c.data_type)) == s.type
                                   for c, s in zip(config_tensors, ort_tensors))}

    (out,) = session.run(None, {config.input[0].name: case.images})
    return {"onnxruntime": ort.__version__,
            "name": config.name, "platform": config.platform, "max_batch_size": config.max_batch_size,
            "dynamic_batching": config.HasField("dynamic_batching"),
            "max_queue_delay_microseconds": config.dynamic_batching.max_queue_delay_microseconds,
            "instance_counts": [g.count for g in config.instance_group],
            "instance_kinds": [model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group],
            "op_library_filename": list(config.model_operations.op_library_filename),
            "inputs": io(config.input, session.get_inputs()), "outputs": io(config.output, session.get_outputs()),
            "max_abs_err": float(np.abs(out - case.expected).max())}


# ---- Triton: a real server (pytriton's tritonserver, Python backend) ----------------------------------------

def triton_serve_check(model_dir: Path, case: Case, requests: int, concurrency: int, instances: int | None,
                       warmup: int = 0) -> dict:
    """Serves the repository's model with pytriton: the config's name, inputs, outputs and batching,
    ``instances`` (default: the config's count) inference functions, each with its own session made
    from the config (docs/serving.md's pytriton block); then the load, through tritonclient."""
    import tritonclient.http as httpclient
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    docs = doc_code("def bind_onnx_model")
    config = read_config(model_dir)
    from tritonclient.grpc import model_config_pb2

    def tensors(items):
        return [Tensor(name=t.name, dtype=NUMPY_TYPES[model_config_pb2.DataType.Name(t.data_type)],
                       shape=tuple(t.dims)) for t in items]

    instances = instances or sum(g.count for g in config.instance_group)
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    result = {"instances": instances}
    # the Python backend's stub must load this interpreter's libpython, not the system's (whose
    # patch level may differ: docs/serving.md)
    libdir = sysconfig.get_config_var("LIBDIR")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p)
    t0 = time.perf_counter()
    # exit_timeout_secs: the server waits that long for clients at shutdown (default 30 s)
    token = secrets.token_urlsafe(16)  # pytriton restricts the statistics API to a token holder
    with Triton(config=TritonConfig(**ports, log_verbose=0, exit_timeout_secs=2),
                security_config=TritonSecurityConfig(access_token=token)) as triton:
        docs["bind_onnx_model"](triton, config.name, str(model_dir / "1" / "model.onnx"),
                                list(config.model_operations.op_library_filename),
                                inputs=tensors(config.input), outputs=tensors(config.output), instances=instances,
                                max_batch=config.max_batch_size)
        triton.run()
        result["server_start_s"] = time.perf_counter() - t0
        local = threading.local()
        input_name, output_name = config.input[0].name, config.output[0].name

        def send(images):
            if not hasattr(local, "client"):
                local.client = httpclient.InferenceServerClient(url=f"127.0.0.1:{ports['http_port']}")
            request = httpclient.InferInput(input_name, list(images.shape), "FP32")
            request.set_data_from_numpy(images)
            answer = local.client.infer(config.name, [request], outputs=[httpclient.InferRequestedOutput(output_name)])
            return answer.as_numpy(output_name), {}

        client = httpclient.InferenceServerClient(url=f"127.0.0.1:{ports['http_port']}")
        result["server_live"] = client.is_server_live()
        result["model_ready"] = client.is_model_ready(config.name)
        metadata = client.get_server_metadata()
        result["server"] = {"name": metadata["name"], "version": metadata["version"]}
        result["served_config"] = client.get_model_config(config.name)
        sent = 0  # images answered, warm-up included: what Triton's inference_count must reach
        if warmup:  # first runs of each session (allocations, thread pools): not what is measured
            sent += sum(r["images"] for r in run_load(send, case, warmup, concurrency)["records"] if r["ok"])
        load = run_load(send, case, requests, concurrency)
        sent += sum(r["images"] for r in load["records"] if r["ok"])
        # Triton's own count: inference_count (requests' batch items) over execution_count (model
        # runs) > 1 means its dynamic batcher merged requests. The server counts a batch after its
        # responses are sent (a CI run read 118 of 120 at once): read until the count is complete
        # or 10 s have passed.
        deadline = time.monotonic() + 10
        while True:
            stats = client.get_inference_statistics(config.name, headers={"triton-access-token": token})
            stats = stats["model_stats"][0]
            if int(stats["inference_count"]) >= sent or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        result["inference_count"] = stats["inference_count"]
        result["execution_count"] = stats["execution_count"]
    result["load"] = _summary(load)
    return result


# ---- Ray Serve ------------------------------------------------------------------------------------------------

REPLICA_ACTOR = "SERVE_REPLICA::"
REQUEST_TIMEOUT_S = 10


def ray_check(case: Case, replicas: int, requests: int, concurrency: int, kill_after: int | None,
              warmup: int = 0) -> dict:
    """A local Ray cluster; docs/serving.md's deployment with ``replicas`` replicas, each with its own
    ORT session; ``requests`` HTTP requests from ``concurrency`` threads. ``kill_after``: after that
    many answers one replica is killed (``ray.kill``) under the load; then the deployment must come
    back to ``replicas`` running replicas, and the next requests reach the new one."""
    import ray
    import requests as http
    from ray import serve

    docs = doc_code("@serve.deployment")
    port = free_port()
    result = {"ray": ray.__version__, "replicas": replicas}
    t0 = time.perf_counter()
    ray.init(num_cpus=replicas + 2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024 * 1024, configure_logging=False)
    try:
        # request_timeout_s: a request caught on a killed replica can hang; the proxy answers it
        # 408 after that long (without it, only the client's timeout ends it)
        serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": REQUEST_TIMEOUT_S})
        import opforge  # the ray venv sees this venv's opforge: the library path as users get it

        # health_check_period_s: Serve finds a killed replica at its next health check (every 10 s
        # by default); a recovery is what is checked, not how soon Serve looks (measured: 10.6 s)
        app = docs["OnnxModel"].options(num_replicas=replicas, health_check_period_s=1).bind(
            str(case.dir / "model.onnx"), opforge.ort_library_path())
        serve.run(app, name="default", route_prefix="/")
        result["start_s"] = time.perf_counter() - t0
        url = f"http://127.0.0.1:{port}/"
        session = threading.local()

        def send(images):
            if not hasattr(session, "s"):
                session.s = http.Session()
            body = io.BytesIO()
            np.save(body, images)
            r = session.s.post(url, data=body.getvalue(), timeout=3 * REQUEST_TIMEOUT_S)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            return np.load(io.BytesIO(r.content)), {"replica": r.headers["x-replica"],
                                                     "batched": int(r.headers["x-batched-requests"])}

        def replica_actors() -> set:
            return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith(REPLICA_ACTOR)}

        before = replica_actors()
        result["replica_actors_before"] = len(before)
        if warmup:  # first runs of each session: not what is measured
            run_load(send, case, warmup, concurrency)
        if kill_after is None:
            load = run_load(send, case, requests, concurrency)
        else:
            # the load runs from before the kill until the deployment has recovered and served
            # another round; ``requests`` bounds it
            stop, live, holder = threading.Event(), [], {}
            loader = threading.Thread(target=lambda: holder.update(load=run_load(send, case, requests, concurrency,
                                                                                   stop, live)))
            loader.start()
            while len(live) < kill_after and loader.is_alive():
                time.sleep(0.01)
            victim = sorted(before)[0]
            killed_at = time.perf_counter()
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            deadline = killed_at + 120
            while time.perf_counter() < deadline:
                # recovered: a new replica actor, the dead one gone, as many RUNNING as asked (the
                # status alone can still count the dead one as RUNNING for a moment)
                after = replica_actors()
                status = serve.status().applications["default"].deployments["OnnxModel"]
                running = status.replica_states.get("RUNNING", 0)
                if (after - before and victim not in after and running == replicas
                        and str(status.status).endswith("HEALTHY")):
                    break
                time.sleep(0.1)
            recovered_at = time.perf_counter()
            time.sleep(1.0)  # another round of requests, on the recovered deployment
            stop.set()
            loader.join()
            load = holder["load"]
            new_ids = {n.rsplit("#", 1)[-1] for n in after - before}
            late = [r for r in load["records"] if r["end"] > recovered_at]
            result.update(killed=victim, killed_after_requests=kill_after, recovered_s=recovered_at - killed_at,
                          running_after=running, killed_still_listed=victim in after, new_replicas=len(after - before),
                          requests_after_recovery=len(late),
                          failed_after_recovery=sum(not r["ok"] for r in late),
                          new_replica_answered=any(r["ok"] and r["replica"] in new_ids for r in late),
                          failed_indices=[r["index"] for r in load["records"] if not r["ok"]])
        result["load"] = _summary(load)
        ok = [r for r in load["records"] if r["ok"]]
        result["replicas_answering"] = len({r["replica"] for r in ok})
        result["max_batched_requests"] = max((r["batched"] for r in ok), default=0)
    finally:
        serve.shutdown()
        ray.shutdown()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("triton-config")
    c.add_argument("model_dir", type=Path)
    c.add_argument("case_dir", type=Path)
    c.add_argument("out", type=Path)
    t = sub.add_parser("triton-serve")
    t.add_argument("model_dir", type=Path)
    t.add_argument("case_dir", type=Path)
    t.add_argument("out", type=Path)
    t.add_argument("--instances", type=int, default=None)
    r = sub.add_parser("ray")
    r.add_argument("case_dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--replicas", type=int, default=2)
    r.add_argument("--kill-after", type=int, default=None)
    for s in (t, r):
        s.add_argument("--requests", type=int, default=60)
        s.add_argument("--concurrency", type=int, default=6)
        s.add_argument("--warmup", type=int, default=0, help="requests sent before the measured ones")
    args = p.parse_args(argv)
    try:
        if args.command == "triton-config":
            result = triton_config_check(args.model_dir, Case(args.case_dir))
        elif args.command == "triton-serve":
            result = triton_serve_check(args.model_dir, Case(args.case_dir), args.requests, args.concurrency,
                                        args.instances, args.warmup)
        else:
            result = ray_check(Case(args.case_dir), args.replicas, args.requests, args.concurrency, args.kill_after,
                               args.warmup)
    except Exception:  # noqa: BLE001 - the test shows it
        result = {"error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
