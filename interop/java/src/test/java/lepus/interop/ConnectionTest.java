package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AuthenticationFailureException;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.LongString;
import com.rabbitmq.client.Recoverable;
import com.rabbitmq.client.SaslConfig;
import com.rabbitmq.client.SaslMechanism;
import com.rabbitmq.client.ShutdownSignalException;
import com.rabbitmq.client.impl.LongStringHelper;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** connection.* : handshake, authentication, tuning, vhosts, heartbeats, capabilities, blocked listener. */
class ConnectionTest extends BrokerTest {

    @Test
    void serverPropertiesAdvertiseRabbitMqCapabilities() {
        Map<String, Object> props = conn.getServerProperties();
        assertNotNull(props.get("product"), "server properties carry a product");
        assertNotNull(props.get("version"), "server properties carry a version");
        @SuppressWarnings("unchecked")
        Map<String, Object> caps = (Map<String, Object>) props.get("capabilities");
        assertNotNull(caps, "server properties carry a capabilities table");
        for (String cap : List.of("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
                "authentication_failure_close", "per_consumer_qos")) {
            assertEquals(Boolean.TRUE, caps.get(cap), "capability " + cap);
        }
    }

    @Test
    void tuneNegotiatesRabbitMqDefaults() {
        // The Java client asks for channel_max 2047, frame_max 0 (no limit), heartbeat 60;
        // the lower non-zero value wins, so RabbitMQ's defaults come back.
        assertEquals(2047, conn.getChannelMax());
        assertEquals(131072, conn.getFrameMax());
        assertEquals(60, conn.getHeartbeat());
    }

    @Test
    void tuneHonoursLowerClientLimits() throws Exception {
        ConnectionFactory f = Broker.factory();
        f.setRequestedChannelMax(10);
        f.setRequestedFrameMax(8192);
        f.setRequestedHeartbeat(30);
        try (Connection c = f.newConnection()) {
            assertEquals(10, c.getChannelMax());
            assertEquals(8192, c.getFrameMax());
            assertEquals(30, c.getHeartbeat());
            // A body bigger than frame_max is split into several body frames and still arrives whole.
            Channel channel = c.createChannel();
            String q = channel.queueDeclare().getQueue();
            byte[] body = new byte[50_000];
            Arrays.fill(body, (byte) 'z');
            channel.basicPublish("", q, null, body);
            assertTrue(Arrays.equals(body, Broker.getWithin(channel, q, true).getBody()));
        }
    }

    @Test
    void plainAuthenticationWithWrongPasswordThrowsAuthenticationFailureException() {
        ConnectionFactory f = Broker.factory();
        f.setPassword(Broker.URL.password() + "-wrong");
        AuthenticationFailureException e = assertThrows(AuthenticationFailureException.class, f::newConnection);
        assertTrue(e.getMessage().contains("ACCESS_REFUSED"), e.getMessage());
    }

    @Test
    void amqplainAuthenticationSucceeds() throws Exception {
        ConnectionFactory f = Broker.factory();
        f.setSaslConfig(amqplain());
        try (Connection c = f.newConnection()) {
            assertTrue(c.isOpen());
            Channel channel = c.createChannel();
            assertTrue(channel.queueDeclare().getQueue().startsWith("amq.gen-"));
        }
    }

    @Test
    void amqplainAuthenticationWithWrongPasswordIsRefused() {
        ConnectionFactory f = Broker.factory();
        f.setPassword(Broker.URL.password() + "-wrong");
        f.setSaslConfig(amqplain());
        AuthenticationFailureException e = assertThrows(AuthenticationFailureException.class, f::newConnection);
        assertTrue(e.getMessage().contains("ACCESS_REFUSED"), e.getMessage());
    }

    /** AMQPLAIN: the response is an AMQP field table (without its length prefix) with LOGIN and PASSWORD. */
    private static SaslConfig amqplain() {
        return mechanisms -> {
            for (String m : mechanisms) {
                if (m.equals("AMQPLAIN")) {
                    return new SaslMechanism() {
                        @Override
                        public String getName() {
                            return "AMQPLAIN";
                        }

                        @Override
                        public LongString handleChallenge(LongString challenge, String username, String password) {
                            try {
                                ByteArrayOutputStream buf = new ByteArrayOutputStream();
                                DataOutputStream out = new DataOutputStream(buf);
                                writeLongStringField(out, "LOGIN", username);
                                writeLongStringField(out, "PASSWORD", password);
                                return LongStringHelper.asLongString(buf.toByteArray());
                            } catch (IOException e) {
                                throw new IllegalStateException(e);
                            }
                        }
                    };
                }
            }
            throw new AssertionError("server does not offer AMQPLAIN: " + Arrays.toString(mechanisms));
        };
    }

    private static void writeLongStringField(DataOutputStream out, String name, String value) throws IOException {
        byte[] n = name.getBytes(StandardCharsets.UTF_8);
        byte[] v = value.getBytes(StandardCharsets.UTF_8);
        out.writeByte(n.length);
        out.write(n);
        out.writeByte('S');
        out.writeInt(v.length);
        out.write(v);
    }

    @Test
    void serverOffersPlainAndAmqplainMechanisms() throws Exception {
        CompletableFuture<String[]> offered = new CompletableFuture<>();
        ConnectionFactory f = Broker.factory();
        SaslConfig dflt = f.getSaslConfig();
        f.setSaslConfig(mechanisms -> {
            offered.complete(mechanisms);
            return dflt.getSaslMechanism(mechanisms);
        });
        try (Connection c = f.newConnection()) {
            List<String> names = Arrays.asList(offered.get(1, TimeUnit.SECONDS));
            assertTrue(names.contains("PLAIN"), names.toString());
            assertTrue(names.contains("AMQPLAIN"), names.toString());
        }
    }

    @Test
    void openingUnknownVhostIsRefusedWith530NotAllowed() {
        ConnectionFactory f = Broker.factory();
        f.setVirtualHost(Broker.unique("no-such-vhost"));
        IOException e = assertThrows(IOException.class, f::newConnection);
        ShutdownSignalException sse = Broker.assertConnectionError(530, "NOT_ALLOWED", null, e);
        assertTrue(Broker.replyText(sse).contains(f.getVirtualHost()), Broker.replyText(sse));
    }

    @Test
    void connectionErrorClosesConnectionWithHardError540ForPrefetchSize() throws Exception {
        // RabbitMQ does not implement basic.qos prefetch_size != 0: a connection error 540 NOT_IMPLEMENTED.
        Exception e = assertThrows(Exception.class, () -> ch.basicQos(1024, 10, false));
        Broker.assertConnectionError(540, "NOT_IMPLEMENTED", conn, e);
        assertFalse(ch.isOpen());
    }

    @Test
    void automaticRecoveryIsDisabledSoABrokerClosedConnectionStaysClosed() throws Exception {
        assertFalse(Broker.factory().isAutomaticRecoveryEnabled());
        assertFalse(conn instanceof Recoverable, "connection must not be an auto-recovering one");
        CompletableFuture<ShutdownSignalException> shutdown = new CompletableFuture<>();
        conn.addShutdownListener(shutdown::complete);
        assertThrows(Exception.class, () -> ch.basicQos(1024, 10, false));
        ShutdownSignalException sse = shutdown.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        assertTrue(sse.isHardError());
        assertFalse(sse.isInitiatedByApplication());
        Thread.sleep(300);
        assertFalse(conn.isOpen(), "no recovery: the connection stays closed");
        assertThrows(Exception.class, conn::createChannel);
    }

    @Test
    void requestedHeartbeatOfOneSecondKeepsIdleConnectionAliveForFourSeconds() throws Exception {
        ConnectionFactory f = Broker.factory();
        f.setRequestedHeartbeat(1);
        try (Connection c = f.newConnection()) {
            assertEquals(1, c.getHeartbeat());
            Channel channel = c.createChannel();
            Thread.sleep(4_000);
            assertTrue(c.isOpen(), "heartbeats keep the idle connection open");
            assertTrue(channel.isOpen());
            String q = channel.queueDeclare().getQueue();
            channel.basicPublish("", q, null, Broker.bytes("still alive"));
            assertEquals("still alive", Broker.body(Broker.getWithin(channel, q, true)));
        }
    }

    @Test
    void memoryAlarmBlocksAPublishingConnectionWithConnectionBlocked() throws Exception {
        try (MemoryAlarm alarm = MemoryAlarm.raise()) {
            Connection c = alarm.factory().newConnection();
            try {
                publishUnderAlarm(alarm, c);
            } finally {
                c.abort(2_000); // a blocked connection is not read: no close handshake
            }
        }
    }

    /** Publishes once (only publishers are blocked) and expects connection.blocked, then unblocked where the alarm can clear. */
    private static void publishUnderAlarm(MemoryAlarm alarm, Connection c) throws Exception {
        @SuppressWarnings("unchecked")
        Map<String, Object> clientCaps = (Map<String, Object>) c.getClientProperties().get("capabilities");
        assertEquals(Boolean.TRUE, clientCaps.get("connection.blocked"), "the client asks for connection.blocked");
        BlockingQueue<String> events = new LinkedBlockingQueue<>();
        c.addBlockedListener(reason -> events.add("blocked:" + reason), () -> events.add("unblocked"));
        Channel channel = c.createChannel();
        String q = channel.queueDeclare().getQueue();
        channel.basicPublish("", q, null, Broker.bytes("held back"));
        assertEquals("blocked:low on memory", events.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        if (!alarm.canClear()) {
            return;
        }
        alarm.clear();
        assertEquals("unblocked", events.poll(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS));
        assertEquals("held back", Broker.body(Broker.getWithin(channel, q, true)));
    }

    @Test
    void clientCloseIsCleanAndInitiatedByApplication() throws Exception {
        CompletableFuture<ShutdownSignalException> shutdown = new CompletableFuture<>();
        conn.addShutdownListener(shutdown::complete);
        conn.close();
        ShutdownSignalException sse = shutdown.get(Broker.TIMEOUT_MS, TimeUnit.MILLISECONDS);
        assertTrue(sse.isInitiatedByApplication());
        assertTrue(sse.isHardError());
        assertEquals(200, Broker.replyCode(sse));
        assertFalse(conn.isOpen());
    }

    @Test
    void manyChannelsOnOneConnectionWorkIndependently() throws Exception {
        List<Channel> channels = new ArrayList<>();
        for (int i = 0; i < 100; i++) {
            channels.add(conn.createChannel());
        }
        String q = declareQueue("many-channels");
        for (int i = 0; i < channels.size(); i++) {
            channels.get(i).basicPublish("", q, null, Broker.bytes("from-" + channels.get(i).getChannelNumber()));
        }
        // one channel's error leaves the others alone
        Channel broken = channels.get(50);
        assertThrows(IOException.class, () -> broken.queueDeclarePassive(Broker.unique("missing")));
        assertFalse(broken.isOpen());
        long deadline = System.currentTimeMillis() + Broker.TIMEOUT_MS;
        while (ch.queueDeclarePassive(q).getMessageCount() < 100 && System.currentTimeMillis() < deadline) {
            Thread.sleep(10);
        }
        assertEquals(100, ch.queueDeclarePassive(q).getMessageCount());
        for (Channel c : channels) {
            if (c != broken) {
                assertTrue(c.isOpen());
                c.close();
            }
        }
        assertInstanceOf(Integer.class, conn.getChannelMax());
    }
}
