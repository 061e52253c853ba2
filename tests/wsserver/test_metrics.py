from __future__ import annotations

import pickle

from wsserver.metrics import ServerMetrics


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
    total = ServerMetrics.merged([pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b))])
    text = total.render({})
    assert "ttsws_ttfa_seconds_count 2" in text and 'ttsws_ttfa_seconds_bucket{le="0.1"} 1' in text
    assert 'ttsws_errors_total{code="bad_json"} 3' in text and 'ttsws_closes_total{code="4408"} 1' in text
    assert a.errors["bad_json"] == 1  # the parts are left as they were
