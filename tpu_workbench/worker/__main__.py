import time

STARTED = time.perf_counter()  # before torch is imported: the worker's import time starts here

from .serve import main  # noqa: E402

main(started=STARTED)
