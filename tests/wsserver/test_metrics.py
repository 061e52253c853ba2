from __future__ import annotations

from wsserver.metrics import ServerMetrics


def test_render_histograms_counters_and_gauges() -> None:
    metrics = ServerMetrics()
    metrics.ttfa.observe(0.07)
    metrics.ttfa.observe(20.0)
    metrics.errors["bad_json"] += 2
    metrics.gauges = {"ttsws_sessions_active": 3}
    text = metrics.render()
    assert 'ttsws_ttfa_seconds_bucket{le="0.05"} 0' in text
    assert 'ttsws_ttfa_seconds_bucket{le="0.1"} 1' in text
    assert 'ttsws_ttfa_seconds_bucket{le="+Inf"} 2' in text
    assert "ttsws_ttfa_seconds_count 2" in text
    assert 'ttsws_errors_total{code="bad_json"} 2' in text
    assert "# TYPE ttsws_sessions_active gauge\nttsws_sessions_active 3.0" in text
