"""Prometheus text exposition (format 0.0.4) for the server's counters, gauges and histograms. Sans-I/O."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + body + "}"


def _number(value: float) -> str:
    return repr(float(value)) if value not in (float("inf"), float("-inf")) else ("+Inf" if value > 0 else "-Inf")


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    @classmethod
    def of(cls, buckets: tuple[float, ...], counts: Sequence[int], total: float) -> Histogram:
        """A histogram counted elsewhere: `counts` per bucket (not cumulative, the last one +Inf), their sum `total`."""
        histogram = cls(buckets)
        if len(counts) != len(histogram.counts):
            raise ValueError(f"{len(counts)} counts for {len(buckets)} buckets and +Inf")
        histogram.counts = list(counts)
        histogram.sum, histogram.count = total, sum(counts)
        return histogram

    def add(self, other: Histogram) -> None:
        assert other.buckets == self.buckets
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum += other.sum
        self.count += other.count

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str) -> list[str]:
        lines, cumulative = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        return [*lines, f"{name}_sum {_number(self.sum)}", f"{name}_count {self.count}"]


_SECONDS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_RATIO = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class ServerMetrics:
    """What a server process measures (counters and histograms); `merged` sums those of every worker process, and
    `render` adds the gauges of current load, which the caller computes for the whole server."""

    def __init__(self) -> None:
        self.ttfa = Histogram(_SECONDS)  # first text of a context -> its first audio frame queued for sending
        self.queue_wait = Histogram(_SECONDS)  # a segment waiting for an engine slot
        self.rtf = Histogram(_RATIO)  # generation time / audio duration, per context
        self.errors: defaultdict[str, int] = defaultdict(int)  # by error code
        self.closes: defaultdict[int, int] = defaultdict(int)  # server-initiated closes, by close code
        self.contexts: defaultdict[str, int] = defaultdict(int)  # ended contexts, by outcome
        self.opus_frames: defaultdict[int, int] = defaultdict(int)  # Opus frames encoded, by complexity (opus_load)

    @classmethod
    def merged(cls, parts: list[ServerMetrics]) -> ServerMetrics:
        total = cls()
        for part in parts:
            for mine, theirs in ((total.ttfa, part.ttfa), (total.queue_wait, part.queue_wait), (total.rtf, part.rtf)):
                mine.add(theirs)
            for mine_counts, theirs_counts in (
                (total.errors, part.errors),
                (total.closes, part.closes),
                (total.contexts, part.contexts),
                (total.opus_frames, part.opus_frames),
            ):
                for key, n in theirs_counts.items():
                    mine_counts[key] += n
        return total

    def render(self, gauges: dict[str, float], histograms: Mapping[str, Histogram] | None = None) -> str:
        """The exposition: this object's histograms and counters, then `histograms` and `gauges`, which the caller
        computes for the whole server (names from _HISTOGRAM_HELP and _GAUGE_HELP)."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, lines: list[str]) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines])

        family(
            "ttsws_ttfa_seconds",
            "histogram",
            "First text to first audio frame, per context.",
            self.ttfa.render("ttsws_ttfa_seconds"),
        )
        family(
            "ttsws_queue_wait_seconds",
            "histogram",
            "Time a segment waited for an engine slot.",
            self.queue_wait.render("ttsws_queue_wait_seconds"),
        )
        family(
            "ttsws_rtf",
            "histogram",
            "Real-time factor (generation time / audio time), per context.",
            self.rtf.render("ttsws_rtf"),
        )
        family(
            "ttsws_errors_total",
            "counter",
            "Error messages sent, by code.",
            [f"ttsws_errors_total{_labels({'code': c})} {n}" for c, n in sorted(self.errors.items())],
        )
        family(
            "ttsws_closes_total",
            "counter",
            "Connections closed by the server, by close code.",
            [f"ttsws_closes_total{_labels({'code': str(c)})} {n}" for c, n in sorted(self.closes.items())],
        )
        family(
            "ttsws_contexts_total",
            "counter",
            "Contexts ended, by outcome (done, cancelled, failed).",
            [f"ttsws_contexts_total{_labels({'outcome': o})} {n}" for o, n in sorted(self.contexts.items())],
        )
        family(
            "ttsws_opus_frames_total",
            "counter",
            "Opus frames encoded, by encoder complexity (a busy worker lowers it).",
            [
                f"ttsws_opus_frames_total{_labels({'complexity': str(c)})} {n}"
                for c, n in sorted(self.opus_frames.items())
            ],
        )
        for name, histogram in sorted((histograms or {}).items()):
            family(name, "histogram", _HISTOGRAM_HELP[name], histogram.render(name))
        for name, value in sorted(gauges.items()):
            family(name, "gauge", _GAUGE_HELP[name], [f"{name} {_number(value)}"])
        return "\n".join(out) + "\n"


_HISTOGRAM_HELP = {
    "ttsws_engine_step_duration_seconds": "Engine step durations since the start, all engines.",
}

_GAUGE_HELP = {
    "ttsws_sessions_active": "Open WebSocket sessions.",
    "ttsws_speech_requests_active": "POST /v1/audio/speech requests generating.",
    "ttsws_contexts_active": "Open contexts across all sessions.",
    "ttsws_contexts_queued": "Segments waiting for an engine slot.",
    "ttsws_contexts_paused": "Segments paused because their client does not read.",
    "ttsws_engine_running": "Requests the engine is stepping.",
    "ttsws_engine_waiting": "Requests queued inside the engine.",
    "ttsws_engine_batch_size": "Average engine batch size over recent steps.",
    "ttsws_engine_step_seconds": "Average engine step time over recent steps.",
    "ttsws_engine_kv_blocks_free": "Free KV-cache blocks.",
    "ttsws_engines_healthy": "Engines serving (one per GPU).",
    "ttsws_workers": "Front-end worker processes reporting.",
}
