"""Tracing is off unless the environment names an OTLP endpoint, and off costs no import."""

from __future__ import annotations

import subprocess
import sys

from shared import tracing


def test_only_an_otlp_endpoint_turns_tracing_on() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    )


def test_off_the_services_import_nothing_of_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from shared import tracing\n"
        "import services.ingest.app, services.orders.app, services.bonuses.app\n"
        "import services.email.app, services.api.app, services.reconciler.app\n"
        "assert not tracing.configure('payhooks-test')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_carried_headers_are_text_and_received_at_a_number() -> None:
    headers = {
        "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "received-at": "1765000000.250",
        "provider": "xhub",
        "x-delivery-count": 2,
    }
    assert tracing.carried(headers) == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "received-at": "1765000000.250",
    }
    assert tracing.received_at(headers) == 1765000000.25
    assert tracing.received_at({}) is None
    assert tracing.received_at({"received-at": "soon"}) is None
    assert tracing.current_headers() == {}  # off


def test_a_step_span_off_is_a_no_op() -> None:
    with tracing.StepSpan("smtp send", **{"payhooks.emails": 3}):
        pass


def test_a_batch_whose_traces_were_not_sampled_gets_no_spans() -> None:
    sampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    left_out = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
    assert not tracing.worth_tracing([sampled])  # off
    tracing._tracer = object()  # type: ignore[assignment]  # on, as far as this check goes
    try:
        assert tracing.worth_tracing([left_out, sampled])
        assert tracing.worth_tracing([{}])  # a new trace: the sampler decides
        assert not tracing.worth_tracing([left_out, left_out])
    finally:
        tracing._tracer = None


def test_one_payment_in_a_hundred_unless_the_environment_chooses_a_sampler() -> None:
    chosen = tracing.sampler({})
    assert chosen is not None
    assert chosen.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.01},")
    assert tracing.sampler({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}) is None
