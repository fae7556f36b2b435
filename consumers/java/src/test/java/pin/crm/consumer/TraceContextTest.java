package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import org.junit.jupiter.api.Test;

class TraceContextTest {
    @Test
    void continuesTheRecordsTrace() {
        var child = TraceContext.childOf(Map.of(
                "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "tracestate", "congo=t61rcWkgMzE")).orElseThrow();
        assertEquals("0af7651916cd43dd8448eb211c80319c", child.traceId());
        assertEquals("b7ad6b7169203331", child.parentSpanId());
        assertNotEquals("b7ad6b7169203331", child.spanId());
        assertEquals(16, child.spanId().length());
        assertTrue(child.sampled());
        assertEquals("00-0af7651916cd43dd8448eb211c80319c-" + child.spanId() + "-01", child.traceparent());
        assertEquals("congo=t61rcWkgMzE", child.fields().get("tracestate"));
    }

    @Test
    void invalidContextsStartNoChild() {
        for (String bad : new String[] {
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "not a traceparent"}) {
            assertFalse(TraceContext.childOf(Map.of("traceparent", bad)).isPresent(), bad);
        }
        assertFalse(TraceContext.childOf(Map.of()).isPresent());
        assertFalse(TraceContext.childOf(Map.of("traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")).orElseThrow().sampled());
    }
}
