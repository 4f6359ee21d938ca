"""AccelerateOperator vs a plain ``accelerate launch`` of the same script with the same 2 processes (goal <= 1.1x).

Both run on CPU with gloo (``ACCELERATE_USE_CPU=1 --multi_gpu --num_processes 2``), interleaved. The operator
row is ``AccelerateOperator.execute()`` on the local backend: envelope, host allocator, child runtime with its
resource summary, launcher and result handling; Airflow's own task start-up is the same for any operator and left
out.

Run: ``.venv/bin/python benchmarks/accelerate_launch.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from _common import airflow_home, alternate, report

SCRIPT = Path(__file__).with_name("accelerate_train_script.py")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    airflow_home()
    from airflow_gpu_provider import AccelerateOperator

    operator = AccelerateOperator(
        task_id="bench", script=str(SCRIPT), cpu=True, num_processes=2, main_process_port=29517
    )
    context = {"ti": SimpleNamespace(dag_id="bench", task_id="bench", run_id="r", try_number=1, map_index=-1)}
    logging.disable(logging.INFO)
    cli = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        "29518",
        str(SCRIPT),
    ]
    environment = {**os.environ, "ACCELERATE_USE_CPU": "1"}

    def plain_cli() -> None:
        subprocess.run(cli, env=environment, check=True, capture_output=True)

    times = alternate(
        runs, **{"AccelerateOperator (local)": lambda: operator.execute(context), "accelerate launch CLI": plain_cli}
    )
    print("# Accelerate benchmark (2 CPU processes, gloo)")
    report(
        "AccelerateOperator vs plain accelerate launch, same script and processes",
        times,
        "accelerate launch CLI",
        "<= 1.1x",
    )


if __name__ == "__main__":
    main()
