package pin.crm.consumer;

import java.util.Map;

/** A minimal JSON object writer (one line, fields in insertion order). */
final class Json {
    private final StringBuilder sb = new StringBuilder(256).append('{');
    private boolean first = true;

    private Json name(String name) {
        if (!first) {
            sb.append(',');
        }
        first = false;
        quote(sb, name);
        sb.append(':');
        return this;
    }

    Json field(String name, String value) {
        name(name);
        if (value == null) {
            sb.append("null");
        } else {
            quote(sb, value);
        }
        return this;
    }

    Json field(String name, long value) {
        name(name).sb.append(value);
        return this;
    }

    Json field(String name, Integer value) {
        name(name).sb.append(value == null ? "null" : value.toString());
        return this;
    }

    /** A nested object of string values (null values, and a null object, as JSON null). */
    Json field(String name, Map<String, String> values) {
        if (values == null) {
            name(name).sb.append("null");
            return this;
        }
        name(name).sb.append('{');
        boolean firstEntry = true;
        for (Map.Entry<String, String> e : values.entrySet()) {
            if (!firstEntry) {
                sb.append(',');
            }
            firstEntry = false;
            quote(sb, e.getKey());
            sb.append(':');
            if (e.getValue() == null) {
                sb.append("null");
            } else {
                quote(sb, e.getValue());
            }
        }
        sb.append('}');
        return this;
    }

    @Override
    public String toString() {
        return sb.toString() + '}';
    }

    static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2);
        quote(out, s);
        return out.toString();
    }

    static void quote(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                default -> {
                    // control characters, and lone surrogates / line separators kept safe for any reader
                    if (c < 0x20 || c == 0x2028 || c == 0x2029 || Character.isSurrogate(c) && !validPair(s, i)) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    private static boolean validPair(String s, int i) {
        char c = s.charAt(i);
        if (Character.isHighSurrogate(c)) {
            return i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1));
        }
        return i > 0 && Character.isHighSurrogate(s.charAt(i - 1));
    }

    private Json() {}

    static Json object() {
        return new Json();
    }
}
