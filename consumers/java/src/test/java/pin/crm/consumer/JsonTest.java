package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.LinkedHashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

class JsonTest {
    @Test
    void escapes() {
        assertEquals("\"a\\\"b\\\\c\\n\\u0001\\t\"", Json.quote("a\"b\\c\n\u0001\t"));
        assertEquals("\"\\ud800x\"", Json.quote("\ud800x"));
        assertEquals("\"\ud83d\ude00\"", Json.quote("\ud83d\ude00"));
    }

    @Test
    void objects() {
        Map<String, String> h = new LinkedHashMap<>();
        h.put("a", "1");
        h.put("b", null);
        assertEquals("{\"s\":\"x\",\"n\":5,\"i\":null,\"h\":{\"a\":\"1\",\"b\":null}}",
                Json.object().field("s", "x").field("n", 5L).field("i", (Integer) null).field("h", h).toString());
    }
}
