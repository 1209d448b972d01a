"""Running the pipeline: one worker's stages (pipeline.py), a run over capture files (offline.py), and live
capture (capture.py): the supervisor, one worker process per core and backend (AF_PACKET, DPDK), the start-up
checks, the status line and Prometheus."""
