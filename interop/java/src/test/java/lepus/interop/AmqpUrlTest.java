package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** The URL helper itself (no broker needed). */
class AmqpUrlTest {

    @Test
    void parsesAllPartsAndDefaultsVhostToSlash() {
        assertEquals(new AmqpUrl("guest", "guest", "127.0.0.1", 5673, "/"),
                AmqpUrl.parse("amqp://guest:guest@127.0.0.1:5673/"));
        assertEquals(new AmqpUrl("guest", "guest", "localhost", 5672, "/"),
                AmqpUrl.parse("amqp://guest:guest@localhost"));
    }

    @Test
    void percentDecodesUserPasswordAndVhost() {
        assertEquals(new AmqpUrl("us@r", "p:a+ss", "h", 1234, "/v/h"),
                AmqpUrl.parse("amqp://us%40r:p%3Aa+ss@h:1234/%2Fv%2Fh"));
        assertEquals("my-vhost", AmqpUrl.parse("amqp://a:b@h:1/my-vhost").vhost());
    }
}
