"""`quest-ort serve --replicas N`: the OpenAI-compatible app of apps/serve/ as N Ray Serve replicas at one address.

    quest-ort serve qwen3-quest --replicas 2 --port 8000    # then any OpenAI client at http://127.0.0.1:8000/v1

One process answers as many requests at once as it has slots (apps/serve/, `--parallel`), its
decode steps batched, over one session. Here a local Ray instance
runs the same FastAPI app (create_app) in N replica processes behind Ray Serve's HTTP proxy, which
sends each request to a replica with fewer requests in flight. Each replica opens the folder itself:
its own QuestModel (ONNX Runtime session, its own copy of the weights in memory) and its own
TextGenerator (one slot: a cache of the folder's capacity, holding the tokens of its last request), so a
conversation sent again reuses a cache only when it lands on the replica that served it before.
Ray Serve is the `replicas` extra (pyproject.toml), imported only here.
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import threading

from ..runtime.generate import check_prefill_mode

log = logging.getLogger("quest_ort.serve")

DEPLOYMENT_NAME = "quest-ort"
INSTALL = "pip install 'quest-ort[replicas]'"


class RayServeMissingError(ImportError):
    """Ray Serve does not import here; the message says how to install it."""


class ReplicaStartError(RuntimeError):
    """The replicas could not open the folder (or start at all); the message is their own error."""


def _import_ray():
    try:
        import ray
        from ray import serve
    except ImportError as error:
        raise RayServeMissingError(f"replicas run on Ray Serve, which does not import here ({error}): "
                                   f"{INSTALL}") from error
    return ray, serve


def replica_threads(replicas: int, threads: int | None) -> int | None:
    """ONNX Runtime intra-op threads of each replica: as asked, else this machine's cores shared out
    (N sessions each sized for all the cores would only fight over them)."""
    if threads is not None or replicas == 1:
        return threads
    return max(1, (os.cpu_count() or 1) // replicas)


def _app_builder(folder: str, name: str, threads: int | None, prefill: str = "exact"):
    """What Ray Serve calls inside each replica to make its app: the model is opened there, so each
    replica has its own session and caches (only these four arguments travel from the driver)."""

    def build():
        from ..runtime.chat import TextGenerator
        from ..runtime.model import QuestModel
        from .serve import create_app

        return create_app(TextGenerator(QuestModel(folder, threads=threads), prefill=prefill), name)

    return build


def application(folder, *, replicas: int, name: str | None = None, threads: int | None = None,
                prefill: str = "exact"):
    """The Ray Serve application (not yet running): `replicas` copies of create_app's app over `folder`."""
    _, serve = _import_ray()
    folder = pathlib.Path(folder).resolve()
    ingress = serve.ingress(_app_builder(str(folder), name or folder.name, replica_threads(replicas, threads),
                                         prefill))
    # One logical CPU each: the local Ray instance is given exactly `replicas` of them.
    deployment = serve.deployment(ingress(), name=DEPLOYMENT_NAME, num_replicas=replicas,
                                  ray_actor_options={"num_cpus": 1})
    return deployment.bind()


def _check_folder(folder: pathlib.Path, prefill: str) -> None:
    """Refuse a folder the replicas could not open (or prefill as asked) before starting Ray (the same
    errors, and exit status, as the single-process server), without loading its weights here."""
    from ..model_folder.sidecar import ModelFolderError, Sidecar
    from ..runtime.text import FolderTokenizer

    problem = Sidecar.read(folder).prefill_problem(check_prefill_mode(prefill))
    if problem is not None:
        raise ModelFolderError(f"{folder} {problem}")
    FolderTokenizer.from_folder(folder)


def _replica_error(serve) -> str | None:
    """Why the replicas failed to start: the last line of the traceback Ray Serve keeps in the
    deployment's status (the replicas' own log lines do not reach this process)."""
    try:
        message = serve.status().applications[DEPLOYMENT_NAME].deployments[DEPLOYMENT_NAME].message
    except (KeyError, AttributeError):
        return None
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve_replicas(folder, replicas: int, *, host: str = "127.0.0.1", port: int = 8000, name: str | None = None,
                   threads: int | None = None, prefill: str = "exact", log_level: str = "info") -> None:
    """Serve the folder with `replicas` replicas on http://host:port until interrupted (Ctrl-C or
    SIGTERM), then stop the replicas and the local Ray instance. Call it before anything else in the
    process imports ray: the settings below are read when ray is imported."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    folder = pathlib.Path(folder)
    _check_folder(folder, prefill)
    # Inherited by the processes Ray starts: no usage-stats report (the one outside call Ray would
    # make), and Ray's single-machine mode (its default on macOS and Windows), whose node address is
    # 127.0.0.1, so that its processes reach each other over the loopback only.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray, serve = _import_ray()
    level = getattr(logging, log_level.upper(), logging.INFO)
    # address="local": a Ray instance of its own, never one this machine already runs. A small object
    # store: requests and replies pass through it, the weights never do.
    ray.init(address="local", num_cpus=replicas, include_dashboard=False, object_store_memory=128 * 1024 * 1024,
             logging_level=max(level, logging.WARNING), log_to_driver=level <= logging.DEBUG)
    logging.getLogger("ray.serve").setLevel(level)  # Serve's own start-up messages: hidden by --quiet
    # Ray's core worker answers SIGTERM by dying at once, leaving its processes to be reaped; as Ctrl-C,
    # it stops the replicas first (their lifespan closes each server), then Ray.
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": log_level.upper()})
        try:
            serve.run(application(folder, replicas=replicas, name=name, threads=threads, prefill=prefill),
                      name=DEPLOYMENT_NAME, route_prefix="/")
        except RuntimeError as error:  # Ray Serve's "Deploying application ... failed", after its retries
            raise ReplicaStartError(f"the replicas did not start: {_replica_error(serve) or error}") from error
        log.info("serving %s as %d replicas on http://%s:%d/v1 (Ray Serve; each replica its own session and cache)",
                 folder, replicas, host, port)
        threading.Event().wait()  # until a signal's KeyboardInterrupt
    except KeyboardInterrupt:  # the way to stop a server, as uvicorn takes it: not an error
        log.info("stopping the replicas")
    finally:
        serve.shutdown()
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous_handler)
