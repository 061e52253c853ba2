from __future__ import annotations

import pickle

import pytest

from wsserver.metrics import Histogram, ServerMetrics


def test_render_histograms_counters_and_gauges() -> None:
    metrics = ServerMetrics()
    metrics.ttfa.observe(0.07)
    metrics.ttfa.observe(20.0)
    metrics.errors["bad_json"] += 2
    text = metrics.render({"ttsws_sessions_active": 3})
    assert 'ttsws_ttfa_seconds_bucket{le="0.05"} 0' in text
    assert 'ttsws_ttfa_seconds_bucket{le="0.1"} 1' in text
    assert 'ttsws_ttfa_seconds_bucket{le="+Inf"} 2' in text
    assert "ttsws_ttfa_seconds_count 2" in text
    assert 'ttsws_errors_total{code="bad_json"} 2' in text
    assert "# TYPE ttsws_sessions_active gauge\nttsws_sessions_active 3.0" in text


def test_the_workers_metrics_add_up() -> None:
    """Each worker process measures its own sessions; the server reports their sum (they travel pickled)."""
    a, b = ServerMetrics(), ServerMetrics()
    a.ttfa.observe(0.07)
    b.ttfa.observe(0.3)
    a.errors["bad_json"] += 1
    b.errors["bad_json"] += 2
    b.closes[4408] += 1
    a.opus_frames[10] += 5
    b.opus_frames[10] += 1
    b.opus_frames[4] += 2
    total = ServerMetrics.merged([pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b))])
    text = total.render({})
    assert "ttsws_ttfa_seconds_count 2" in text and 'ttsws_ttfa_seconds_bucket{le="0.1"} 1' in text
    assert 'ttsws_errors_total{code="bad_json"} 3' in text and 'ttsws_closes_total{code="4408"} 1' in text
    assert 'ttsws_opus_frames_total{complexity="10"} 6' in text and 'ttsws_opus_frames_total{complexity="4"} 2' in text
    assert a.errors["bad_json"] == 1  # the parts are left as they were


def test_histograms_counted_elsewhere_add_up_and_render() -> None:
    """The engines count their step durations per bucket; the server renders the sum over engines."""
    buckets = (0.05, 0.1)
    steps = Histogram(buckets)
    steps.add(Histogram.of(buckets, [3, 1, 0], 0.2))
    steps.add(Histogram.of(buckets, [0, 2, 1], 0.5))
    text = ServerMetrics().render({}, {"ttsws_engine_step_duration_seconds": steps})
    assert "# TYPE ttsws_engine_step_duration_seconds histogram" in text
    assert 'ttsws_engine_step_duration_seconds_bucket{le="0.05"} 3' in text
    assert 'ttsws_engine_step_duration_seconds_bucket{le="0.1"} 6' in text
    assert 'ttsws_engine_step_duration_seconds_bucket{le="+Inf"} 7' in text
    assert "ttsws_engine_step_duration_seconds_count 7" in text and "ttsws_engine_step_duration_seconds_sum 0.7" in text
    with pytest.raises(ValueError, match="2 counts for 2 buckets"):
        Histogram.of(buckets, [1, 2], 0.1)
