"""TensorBoard event files in `WORKDIR/tb`, the same figures as `metrics.jsonl`.

Written with TensorBoard's own protos and record framing (`tensorboard.compat.proto`,
`RecordWriter`), no TensorFlow: each record of a logged split becomes one scalar per figure,
tagged `SPLIT/NAME` (`train/loss`, `train/lr`, `train/images_per_s`, `train/data_wait`,
`validation/accuracy`, ...), at the record's step. Events are appended synchronously, a record
whole or not at all (`append_whole`), so a full disk is the same one line as for metrics.jsonl.

On resume the new run appends a new event file (TensorBoard reads a folder's files as one run).
When the resume set records of metrics.jsonl aside (steps past the checkpoint), the new file
begins with TensorBoard's restart marker (`SessionLog.START` at the first step run again), so
TensorBoard drops the older files' events from that step on and the curves show each step
once; the older files stay as they were, as `metrics.dropped.jsonl` keeps the records. A
workdir without event files (a run of a release without them) gets metrics.jsonl's records
first, so no curve starts mid-run.
"""

from __future__ import annotations

import io
import math
import os
import socket
import time
from pathlib import Path

from vit.training.metrics import append_whole, read_metrics

FOLDER = "tb"
SPLITS = ("train", "validation")


class EventLog:
    """Scalars of metrics records into `folder`; the file is made on the first write."""

    def __init__(self, folder: str | Path):
        self.folder, self.path = Path(folder), None

    def write(self, record: dict, wall_time: float | None = None) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if record.get("split") not in SPLITS or not isinstance(record.get("step"), int):
            return
        values = [summary_pb2.Summary.Value(tag=f"{record['split']}/{key}",
                                            simple_value=float(value))
                  for key, value in record.items()
                  if key not in ("step", "split", "time") and isinstance(value, int | float)
                  and not isinstance(value, bool) and math.isfinite(value)]
        if not values:
            return
        wall_time = wall_time if wall_time is not None else record.get("time", time.time())
        self._append([event_pb2.Event(wall_time=wall_time, step=record["step"],
                                      summary=summary_pb2.Summary(value=values))])

    def backfill(self, metrics_path: Path) -> None:
        """Writes `metrics_path`'s records (a workdir that has no events yet)."""
        for record in read_metrics(metrics_path) if metrics_path.is_file() else []:
            self.write(record)

    def restart(self, step: int) -> None:
        """Marks that the run goes on from `step` again: TensorBoard drops the events of
        the files before this one at `step` and after."""
        from tensorboard.compat.proto import event_pb2

        self._append([event_pb2.Event(wall_time=time.time(), step=step, session_log=event_pb2
                                      .SessionLog(status=event_pb2.SessionLog.START))])

    def has_events(self) -> bool:
        return self.folder.is_dir() and any(self.folder.glob("*tfevents*"))

    def _append(self, events) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        buffer = io.BytesIO()
        writer = RecordWriter(buffer)
        if self.path is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # TensorBoard's naming; nanoseconds keep two runs' files in order within a second.
            self.path = self.folder / (f"events.out.tfevents.{time.time_ns()}."
                                       f"{socket.gethostname()}.{os.getpid()}.vit")
            writer.write(event_pb2.Event(wall_time=time.time(),
                                         file_version="brain.Event:2").SerializeToString())
        for event in events:
            writer.write(event.SerializeToString())
        append_whole(self.path, buffer.getvalue())
