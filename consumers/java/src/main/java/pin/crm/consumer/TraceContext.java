package pin.crm.consumer;

import java.security.SecureRandom;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import java.util.regex.Pattern;

/**
 * The W3C Trace Context of a record ({@code traceparent}, optional {@code tracestate} headers):
 * the span of the worker's expiry batch (or of the replay) that wrote the event. A consumer
 * continues the trace with a child span: same trace id, the record's span id as parent, a new
 * span id of its own. With the OpenTelemetry Java SDK the same is
 * {@code W3CTraceContextPropagator.getInstance().extract(Context.current(), record.headers(), getter)}
 * followed by {@code tracer.spanBuilder("process").setParent(extracted).startSpan()} (see
 * docs/consumers.md); this class does it without the SDK.
 */
public record TraceContext(String traceId, String parentSpanId, String spanId, boolean sampled, String traceState) {
    /** {@code traceparent} header name. */
    public static final String TRACEPARENT = "traceparent";
    /** {@code tracestate} header name. */
    public static final String TRACESTATE = "tracestate";

    private static final Pattern VALID = Pattern.compile("^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$");
    private static final SecureRandom RANDOM = new SecureRandom();

    /**
     * The consumer's child span context of the record's trace context; empty when the record has no
     * valid {@code traceparent} (version ff, all-zero ids and malformed values are invalid).
     */
    public static Optional<TraceContext> childOf(Map<String, String> headers) {
        String traceparent = headers.get(TRACEPARENT);
        if (traceparent == null) {
            return Optional.empty();
        }
        var m = VALID.matcher(traceparent.trim());
        if (!m.matches() || m.group(1).equals("ff")
                || (m.group(1).equals("00") && m.group(5) != null)) {
            return Optional.empty();
        }
        String traceId = m.group(2);
        String parent = m.group(3);
        if (traceId.chars().allMatch(c -> c == '0') || parent.chars().allMatch(c -> c == '0')) {
            return Optional.empty();
        }
        boolean sampled = (Integer.parseInt(m.group(4), 16) & 1) == 1;
        return Optional.of(new TraceContext(traceId, parent, newSpanId(), sampled, headers.get(TRACESTATE)));
    }

    /** The child's own {@code traceparent}, for whatever the consumer calls next. */
    public String traceparent() {
        return "00-" + traceId + "-" + spanId + "-" + (sampled ? "01" : "00");
    }

    /** The fields of the {@code trace} object of a JSON line. */
    public Map<String, String> fields() {
        Map<String, String> map = new LinkedHashMap<>();
        map.put("trace_id", traceId);
        map.put("parent_span_id", parentSpanId);
        map.put("span_id", spanId);
        map.put("sampled", Boolean.toString(sampled));
        map.put("traceparent", traceparent());
        if (traceState != null) {
            map.put("tracestate", traceState);
        }
        return map;
    }

    private static String newSpanId() {
        long id;
        do {
            id = RANDOM.nextLong();
        } while (id == 0);
        return String.format("%016x", id);
    }
}
