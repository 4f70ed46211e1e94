"""Turns what ranks and nodes report into Samples and Frames for the detectors and the store."""

from __future__ import annotations

from collector._wire import MalformedTelemetry
from collector.base import Source
from collector.errors import CollectorError, ParseError
from collector.events import Event, Parsed
from collector.exporter import ExporterSource, fetch_text
from collector.frames import frames_from_samples
from collector.hooks import TrainingHook
from collector.host import HostSource
from collector.kmsg import KernelLogSource, parse_kmsg
from collector.nccl import (
    CollectiveRecord,
    FlightRecord,
    load_flight_record,
    read_flight_record,
)
from collector.nccl_hang import DumpFolderSource, flight_record_events
from collector.nccl_log import WatchdogLogSource, parse_watchdog_log
from collector.nvml import NvmlPoller
from collector.prometheus_api import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusQuerySource,
)
from collector.promtext import XidTracker, parse_exposition
from collector.transport import TelemetryPublisher, TelemetryReceiver
from collector.types import JOB, Frame, Sample, Subject
from collector.xid import XID_CATALOGUE, XidInfo

__all__ = [
    "JOB",
    "XID_CATALOGUE",
    "CollectiveRecord",
    "CollectorError",
    "DumpFolderSource",
    "Event",
    "ExporterSource",
    "FlightRecord",
    "Frame",
    "HostSource",
    "KernelLogSource",
    "MalformedTelemetry",
    "NvmlPoller",
    "ParseError",
    "PrometheusClient",
    "PrometheusQueryError",
    "PrometheusQuerySource",
    "Parsed",
    "Sample",
    "Source",
    "Subject",
    "TelemetryPublisher",
    "TelemetryReceiver",
    "TrainingHook",
    "WatchdogLogSource",
    "XidInfo",
    "XidTracker",
    "fetch_text",
    "flight_record_events",
    "frames_from_samples",
    "load_flight_record",
    "parse_exposition",
    "parse_kmsg",
    "parse_watchdog_log",
    "read_flight_record",
]
