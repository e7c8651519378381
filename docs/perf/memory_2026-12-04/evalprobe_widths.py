"""../memory_2026-12-03/41b8b4b/evalprobe_hwm.py (argv: calls, base dtype) with, when EVAL_M is
set, every `AnswerAppender` the task builds rounding its batches up to a multiple of EVAL_M
(the dev evaluation's included). Run as that probe's `evalhwm.sh` runs it, in place of it."""
import os
import pathlib
import runpy

from tasks import instruct_run_task

if os.environ.get("EVAL_M"):
    multiple = int(os.environ["EVAL_M"])
    original = instruct_run_task.AnswerAppender

    class RoundedAppender(original):
        def __init__(self, answers, pad_id, width_multiple=1, max_width=None):
            super().__init__(answers, pad_id, max(width_multiple, multiple), max_width)

    instruct_run_task.AnswerAppender = RoundedAppender
    print("EVAL_M", multiple, flush=True)
runpy.run_path(str(pathlib.Path(__file__).parent.parent / "memory_2026-12-03" / "41b8b4b"
                   / "evalprobe_hwm.py"), run_name="__main__")
