"""The model folder's contract, shared by the exporter that writes it and the runtime that reads it.

`settings` (the geometry and sparse settings a folder is exported with), `sidecar` (quest_model.json:
those objects, the layer I/O names and the provenance), `cache` (the caches' layout and a typed
per-layer view), `safety` (external data stays inside the folder) and `folder_check` (the sidecar
checked against the graph). It imports only `ops`; `export` and `runtime` import it, never each other.
"""
