package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.Method;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/** Connection settings and small helpers shared by every test class. */
public final class Broker {

    public static final AmqpUrl URL = AmqpUrl.fromEnv();

    /** Every blocking receive in the suite waits at most this long. */
    public static final long TIMEOUT_MS = 5_000;

    private Broker() {}

    /** A factory for {@link #URL} with bounded timeouts and automatic recovery disabled. */
    public static ConnectionFactory factory() {
        ConnectionFactory f = new ConnectionFactory();
        f.setHost(URL.host());
        f.setPort(URL.port());
        f.setUsername(URL.user());
        f.setPassword(URL.password());
        f.setVirtualHost(URL.vhost());
        f.setAutomaticRecoveryEnabled(false);
        f.setTopologyRecoveryEnabled(false);
        f.setConnectionTimeout((int) TIMEOUT_MS);
        f.setHandshakeTimeout((int) TIMEOUT_MS);
        f.setShutdownTimeout(2_000);
        f.setChannelRpcTimeout((int) TIMEOUT_MS);
        return f;
    }

    public static Connection connect() throws Exception {
        return factory().newConnection("lepus-interop-java");
    }

    /** A name unique to this run, so tests never collide on a shared broker. */
    public static String unique(String prefix) {
        return "interop-java-" + prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    /** Collects deliveries of a consumer; {@link #next()} waits at most {@link #TIMEOUT_MS}. */
    public static final class Inbox {
        public final BlockingQueue<Delivery> deliveries = new LinkedBlockingQueue<>();
        public final BlockingQueue<String> cancels = new LinkedBlockingQueue<>();

        public String consume(Channel ch, String queue, boolean autoAck) throws IOException {
            return ch.basicConsume(queue, autoAck, (tag, d) -> deliveries.add(d), cancels::add);
        }

        public Delivery next() throws InterruptedException {
            Delivery d = deliveries.poll(TIMEOUT_MS, TimeUnit.MILLISECONDS);
            assertNotNull(d, "no delivery within " + TIMEOUT_MS + " ms");
            return d;
        }

        public String nextBody() throws InterruptedException {
            return body(next());
        }

        /** Asserts that nothing more arrives within a short quiet period. */
        public void assertQuiet(long millis) throws InterruptedException {
            Delivery d = deliveries.poll(millis, TimeUnit.MILLISECONDS);
            if (d != null) {
                fail("unexpected delivery: " + body(d));
            }
        }
    }

    public static String body(Delivery d) {
        return new String(d.getBody(), java.nio.charset.StandardCharsets.UTF_8);
    }

    public static String body(com.rabbitmq.client.GetResponse r) {
        return new String(r.getBody(), java.nio.charset.StandardCharsets.UTF_8);
    }

    /** basic.get, retried until a message is there (at most {@link #TIMEOUT_MS}). */
    public static com.rabbitmq.client.GetResponse getWithin(Channel channel, String q, boolean autoAck) throws Exception {
        long deadline = System.currentTimeMillis() + TIMEOUT_MS;
        while (System.currentTimeMillis() < deadline) {
            com.rabbitmq.client.GetResponse r = channel.basicGet(q, autoAck);
            if (r != null) {
                return r;
            }
            Thread.sleep(10);
        }
        throw new AssertionError("no message in " + q + " within " + TIMEOUT_MS + " ms");
    }

    /**
     * basic.get (auto-ack) used as a fence: the queue answers it after every delivery it already
     * dispatched on this channel, so a delivery past a prefetch limit has either taken the message
     * get-ok names or changed the count it reports. (The client hands deliveries to consumers on
     * another thread, so the inbox itself is no fence.)
     */
    public static void fenceGet(Channel channel, String q, String expectedBody, int expectedRemaining) throws Exception {
        com.rabbitmq.client.GetResponse r = channel.basicGet(q, true);
        assertNotNull(r, "the fence found " + q + " empty");
        org.junit.jupiter.api.Assertions.assertEquals(expectedBody + " with " + expectedRemaining + " left",
                body(r) + " with " + r.getMessageCount() + " left", "fence on " + q + ": one delivery too many or too few");
    }

    public static byte[] bytes(String s) {
        return s.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }

    /** Unwraps the ShutdownSignalException the Java client attaches to a failed operation. */
    public static ShutdownSignalException shutdownSignal(Throwable t) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (c instanceof ShutdownSignalException sse) {
                return sse;
            }
        }
        throw new AssertionError("expected a ShutdownSignalException, got " + t, t);
    }

    /** Reply code of a channel.close (hard=false) or connection.close (hard=true). */
    public static int replyCode(ShutdownSignalException sse) {
        Method m = sse.getReason();
        if (m instanceof AMQP.Channel.Close c) {
            return c.getReplyCode();
        }
        if (m instanceof AMQP.Connection.Close c) {
            return c.getReplyCode();
        }
        throw new AssertionError("unexpected shutdown reason " + m);
    }

    public static String replyText(ShutdownSignalException sse) {
        Method m = sse.getReason();
        if (m instanceof AMQP.Channel.Close c) {
            return c.getReplyText();
        }
        if (m instanceof AMQP.Connection.Close c) {
            return c.getReplyText();
        }
        throw new AssertionError("unexpected shutdown reason " + m);
    }

    /** Asserts a channel-level error: the exact reply code, the channel closed, the connection still open. */
    public static ShutdownSignalException assertChannelError(int code, String textPrefix, Channel ch, Throwable t) {
        ShutdownSignalException sse = shutdownSignal(t);
        assertTrue(!sse.isHardError(), "expected a channel error, got a connection error: " + sse);
        org.junit.jupiter.api.Assertions.assertEquals(code, replyCode(sse), "reply code: " + sse);
        assertTrue(replyText(sse).startsWith(textPrefix), "reply text: " + replyText(sse));
        assertTrue(!ch.isOpen(), "channel should be closed");
        assertTrue(ch.getConnection().isOpen(), "connection should stay open");
        return sse;
    }

    /** Asserts a connection-level error with the exact reply code. */
    public static ShutdownSignalException assertConnectionError(int code, String textPrefix, Connection conn, Throwable t) {
        ShutdownSignalException sse = shutdownSignal(t);
        assertTrue(sse.isHardError(), "expected a connection error, got a channel error: " + sse);
        org.junit.jupiter.api.Assertions.assertEquals(code, replyCode(sse), "reply code: " + sse);
        assertTrue(replyText(sse).startsWith(textPrefix), "reply text: " + replyText(sse));
        if (conn != null) {
            assertTrue(!conn.isOpen(), "connection should be closed");
        }
        return sse;
    }
}
