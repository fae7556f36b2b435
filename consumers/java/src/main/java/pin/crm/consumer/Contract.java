package pin.crm.consumer;

import org.apache.kafka.common.utils.Utils;

/** The names and values of the pin.crm.booking-expired.v1 contract (see docs/consumers.md). */
public final class Contract {
    /** The topic the booking-expiration worker publishes to. */
    public static final String TOPIC = "pin.crm.booking-expired.v1";
    /** {@code ce_type} header value (equal to the topic). */
    public static final String EVENT_TYPE = TOPIC;
    /** {@code content-type} header value. */
    public static final String CONTENT_TYPE = "application/protobuf";
    /** {@code ce_specversion} header value. */
    public static final String SPEC_VERSION = "1.0";
    /** {@code contract_version} of every message of package pin.crm.booking.v1. */
    public static final int CONTRACT_VERSION = 1;
    /** {@code aggregate_type} of every message. */
    public static final String AGGREGATE_TYPE = "Booking";

    /** Header names: CloudEvents 1.0 Kafka binary mode plus the tracing headers. */
    public static final class Headers {
        public static final String SPEC_VERSION = "ce_specversion";
        /** The stable event id: equal across republishes, unique per event. Deduplicate on it. */
        public static final String ID = "ce_id";
        public static final String SOURCE = "ce_source";
        public static final String TYPE = "ce_type";
        /** RFC 3339 time of the event (the booking's expired_at). */
        public static final String TIME = "ce_time";
        public static final String CONTENT_TYPE = "content-type";
        /** The producing worker cycle's run id. */
        public static final String CORRELATION_ID = "correlation_id";
        public static final String TENANT_ID = "tenant_id";
        /** W3C Trace Context of the span that wrote the event (see {@link TraceContext}). */
        public static final String TRACEPARENT = "traceparent";
        public static final String TRACESTATE = "tracestate";

        private Headers() {}
    }

    /**
     * The partition the Java client's default partitioner picks for a keyed record:
     * {@code toPositive(murmur2(key)) % partitions}, i.e. {@code (murmur2(key) & 0x7fffffff) % partitions}.
     */
    public static int partitionForKey(byte[] key, int partitions) {
        if (partitions <= 0) {
            throw new IllegalArgumentException("a topic has at least one partition, got " + partitions);
        }
        return Utils.toPositive(Utils.murmur2(key)) % partitions;
    }

    private Contract() {}
}
