"""Checks the event file that tests/loggers/event_file_writer.cpp wrote into DIR.

Reads it with TensorBoard's own readers (EventAccumulator for scalars and the hparams plugin
content, RawEventFileLoader for the records as written) and compares every event, byte for byte,
with what torch.utils.tensorboard produces for the same calls.

Usage: python check_event_file.py DIR   -> prints "ok" and exits 0, or prints each mismatch and exits 1.
"""

import os
import re
import socket
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard.summary import hparams as torch_hparams
from torch.utils.tensorboard.summary import scalar as torch_scalar

HPARAMS = {"lr": 0.01, "batch_size": 32, "optimizer": "adam", "nesterov": True}
METRICS = {"hp_metric": -1}
HPARAM_TAGS = ["_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"]

errors = []


def check(ok, message):
    if not ok:
        errors.append(message)
    return ok


def f32(x):
    """x as a float32 simple_value holds it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def framed_records(path):
    """The file's TFRecord records, walked independently of TensorBoard's reader."""
    data = open(path, "rb").read()
    records, pos = [], 0
    while pos < len(data):
        if not check(pos + 12 <= len(data), f"truncated record header at byte {pos}"):
            break
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        check(header_crc == masked_crc32c(header), f"record at byte {pos}: bad length crc")
        body = data[pos + 12 : pos + 12 + length]
        footer = data[pos + 12 + length : pos + 16 + length]
        if not check(len(body) == length and len(footer) == 4, f"record at byte {pos}: truncated"):
            break
        check(struct.unpack("<I", footer)[0] == masked_crc32c(body), f"record at byte {pos}: bad data crc")
        records.append(body)
        pos += 16 + length
    return records


def read_varint(buf, pos):
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def raw_field(buf, number):
    """The bytes of length-delimited field `number` exactly as written (no re-serialization)."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            if field == number:
                return buf[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return None


def torch_hparams_summaries():
    """torch's (experiment, session_start_info, session_end_info) Summaries, with the hparams map of
    session_start_info in protobuf's deterministic (key) order: upb writes maps in hash-table order,
    which Python seeds per process, so only that order is reproducible (and the writer uses it)."""
    exp, ssi, sei = torch_hparams(HPARAMS, METRICS)
    value = ssi.value[0]
    content = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    value.metadata.plugin_data.content = content.SerializeToString(deterministic=True)
    return [exp, ssi, sei]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    directory = sys.argv[1]
    # The newest file: DIR may keep files of earlier runs.
    files = [os.path.join(directory, f) for f in os.listdir(directory) if f.startswith("events.out.tfevents.")]
    if not files:
        print(f"no events.out.tfevents.* file in {directory}")
        return 1
    path = max(files, key=lambda f: (os.path.getmtime(f), f))
    name = os.path.basename(path)
    match = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)", name)
    if check(match is not None, f"file name {name!r} is not events.out.tfevents.<10-digit secs>.<host>.<pid>.<n>"):
        host = socket.gethostname()
        check(match.group(2) == host, f"host in file name {match.group(2)!r} != {host!r}")

    # --- TensorBoard's accumulator: what the UI sees.
    ea = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()
    check(sorted(tags["scalars"]) == ["acc", "hp_metric", "loss"], f"scalar tags {sorted(tags['scalars'])}")
    expected_scalars = {
        "loss": [(s, f32(1.0 / (s + 1))) for s in range(5)],
        "acc": [(4, f32(0.75))],
        "hp_metric": [(0, -1.0)],
    }
    for tag, want in expected_scalars.items():
        got = [(e.step, e.value) for e in ea.Scalars(tag)] if tag in tags["scalars"] else []
        check(got == want, f"scalars {tag!r}: got {got}, want {want}")

    try:
        content = ea.PluginTagToContent("hparams")
    except KeyError:
        content = {}
    check(sorted(content) == sorted(HPARAM_TAGS), f"hparams plugin tags {sorted(content)}")
    if all(t in content for t in HPARAM_TAGS):
        exp = HParamsPluginData.FromString(content[HPARAM_TAGS[0]])
        ssi = HParamsPluginData.FromString(content[HPARAM_TAGS[1]])
        sei = HParamsPluginData.FromString(content[HPARAM_TAGS[2]])
        for data, kind in [(exp, "experiment"), (ssi, "session_start_info"), (sei, "session_end_info")]:
            check(data.WhichOneof("data") == kind and data.version == 0, f"{kind}: {data}")
        infos = [(h.name, api_pb2.DataType.Name(h.type)) for h in exp.experiment.hparam_infos]
        # torch's hparams() tests isinstance(v, (int, float)) before bool, so bools are FLOAT64 numbers.
        want_infos = [("lr", "DATA_TYPE_FLOAT64"), ("batch_size", "DATA_TYPE_FLOAT64"),
                      ("optimizer", "DATA_TYPE_STRING"), ("nesterov", "DATA_TYPE_FLOAT64")]
        check(infos == want_infos, f"experiment hparam_infos {infos}, want {want_infos}")
        metrics = [m.name.tag for m in exp.experiment.metric_infos]
        check(metrics == ["hp_metric"], f"experiment metric_infos {metrics}")
        values = {k: (v.WhichOneof("kind"), getattr(v, v.WhichOneof("kind")))
                  for k, v in ssi.session_start_info.hparams.items()}
        want_values = {"lr": ("number_value", 0.01), "batch_size": ("number_value", 32.0),
                       "optimizer": ("string_value", "adam"), "nesterov": ("number_value", 1.0)}
        check(values == want_values, f"session_start_info hparams {values}, want {want_values}")
        check(sei.session_end_info.status == api_pb2.STATUS_SUCCESS, f"session_end_info {sei.session_end_info}")

    # --- The records as written, against torch.utils.tensorboard's bytes for the same calls.
    try:
        records = [bytes(r) for r in RawEventFileLoader(path).Load()]
    except Exception as e:  # DataLossError on a bad CRC or a truncated record
        check(False, f"TensorBoard's reader failed: {e!r}")
        records = []
    check(records == framed_records(path), "TensorBoard's reader and the framing walk disagree on the records")
    expected = [("version", None, None)]
    expected += [("summary", s, torch_scalar("loss", 1.0 / (s + 1))) for s in range(5)]
    expected += [("summary", 4, torch_scalar("acc", 0.75))]
    expected += [("summary", None, summary) for summary in torch_hparams_summaries()]
    expected += [("summary", 0, torch_scalar("hp_metric", -1.0))]
    if not check(len(records) == len(expected), f"{len(records)} records, want {len(expected)}"):
        return finish()
    previous_time = 0.0
    for i, (raw, (kind, step, summary)) in enumerate(zip(records, expected)):
        event = Event.FromString(raw)
        check(event.wall_time > 1e9 and event.wall_time >= previous_time, f"event {i}: wall_time {event.wall_time}")
        previous_time = event.wall_time
        if kind == "version":
            want = Event(wall_time=event.wall_time, file_version="brain.Event:2")
        else:
            # As SummaryWriter's FileWriter.add_summary(summary, global_step, walltime) builds it.
            want = Event(wall_time=event.wall_time, summary=summary)
            if step is not None:
                want.step = step
            got_summary = raw_field(raw, 5)
            want_summary = summary.SerializeToString()
            check(got_summary == want_summary,
                  f"event {i}: Summary bytes differ\n  got  {got_summary!r}\n  want {want_summary!r}")
        check(raw == want.SerializeToString(),
              f"event {i}: Event bytes differ\n  got  {raw!r}\n  want {want.SerializeToString()!r}")
    return finish()


def finish():
    for message in errors:
        print(message)
    if errors:
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
