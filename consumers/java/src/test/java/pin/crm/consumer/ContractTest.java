package pin.crm.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.apache.kafka.common.utils.Utils;
import org.junit.jupiter.api.Test;

class ContractTest {
    /** The vectors of Apache Kafka's UtilsTest.testMurmur2, also used by the Rust crate booking-expired-proto. */
    @Test
    void murmur2MatchesKafkaVectors() {
        Object[][] cases = {
            {"21", -973_932_308},
            {"foobar", -790_332_482},
            {"a-little-bit-long-string", -985_981_536},
            {"a-little-bit-longer-string", -1_486_304_829},
            {"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971},
            {"abc", 479_470_107},
        };
        for (Object[] c : cases) {
            assertEquals((int) c[1], Utils.murmur2(((String) c[0]).getBytes(StandardCharsets.UTF_8)), (String) c[0]);
        }
    }

    @Test
    void partitionMasksTheSignBit() {
        // "21" hashes negative: toPositive masks the sign bit (it is not Math.abs)
        assertEquals((-973_932_308 & 0x7fffffff) % 3, Contract.partitionForKey("21".getBytes(StandardCharsets.UTF_8), 3));
        for (int n = 1; n < 50; n++) {
            for (String k : new String[] {"", "a", "ab", "abc", "abcd", "21", "foobar"}) {
                int p = Contract.partitionForKey(k.getBytes(StandardCharsets.UTF_8), n);
                assertTrue(p >= 0 && p < n);
            }
        }
        assertThrows(IllegalArgumentException.class, () -> Contract.partitionForKey(new byte[0], 0));
    }

    @Test
    void aBookingIdKeyIsHashedAsItsCanonicalText() {
        String key = "3d8f2a10-5b6c-4d7e-8f90-a1b2c3d4e5f6";
        int p = Contract.partitionForKey(key.getBytes(StandardCharsets.UTF_8), 3);
        assertEquals(Utils.toPositive(Utils.murmur2(key.getBytes(StandardCharsets.UTF_8))) % 3, p);
    }
}
