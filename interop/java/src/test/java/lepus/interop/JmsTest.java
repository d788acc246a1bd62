package lepus.interop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Command;
import com.rabbitmq.client.TrafficListener;
import com.rabbitmq.jms.admin.RMQConnectionFactory;
import com.rabbitmq.jms.admin.RMQDestination;
import jakarta.jms.BytesMessage;
import jakarta.jms.Connection;
import jakarta.jms.DeliveryMode;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;
import jakarta.jms.Session;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import jakarta.jms.TopicSubscriber;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Enumeration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The RabbitMQ JMS client (jakarta.jms, com.rabbitmq.jms.admin.RMQConnectionFactory) against the broker.
 * Every AMQP method the JMS client exchanges with the broker is recorded (through the Java client's
 * TrafficListener) and written to target/jms-amqp-methods.txt, so a broker author sees exactly what it uses.
 */
class JmsTest extends BrokerTest {

    private static final long RECEIVE_MS = Broker.TIMEOUT_MS;
    private static final Set<String> METHODS_SEEN = Collections.synchronizedSet(new TreeSet<>());

    private Connection jms;

    static RMQConnectionFactory jmsFactory() {
        RMQConnectionFactory f = new RMQConnectionFactory();
        f.setHost(Broker.URL.host());
        f.setPort(Broker.URL.port());
        f.setUsername(Broker.URL.user());
        f.setPassword(Broker.URL.password());
        f.setVirtualHost(Broker.URL.vhost());
        f.setTerminationTimeout(2_000);
        f.setAmqpConnectionFactoryPostProcessor(cf -> {
            cf.setAutomaticRecoveryEnabled(false);
            cf.setConnectionTimeout((int) Broker.TIMEOUT_MS);
            cf.setChannelRpcTimeout((int) Broker.TIMEOUT_MS);
            cf.setTrafficListener(new TrafficListener() {
                @Override
                public void write(Command c) {
                    METHODS_SEEN.add("client> " + describe(c));
                }

                @Override
                public void read(Command c) {
                    METHODS_SEEN.add("server> " + describe(c));
                }
            });
        });
        return f;
    }

    /** Method name plus the arguments that matter to a broker, with queue names and tags blurred. */
    private static String describe(Command c) {
        Object m = c.getMethod();
        String s = m.toString().replaceAll("(jms-[a-z]+-|amq\\.gen-|amq\\.ctag-|interop-java-[a-z-]+-)[A-Za-z0-9_\\-.]+", "$1*");
        s = s.replaceAll("delivery-tag=\\d+", "delivery-tag=N").replaceAll("message-count=\\d+", "message-count=N")
                .replaceAll("consumer-count=\\d+", "consumer-count=N");
        if (m instanceof AMQP.Basic.Publish || m instanceof AMQP.Basic.Deliver || m instanceof AMQP.Basic.GetOk) {
            AMQP.BasicProperties p = (AMQP.BasicProperties) c.getContentHeader();
            if (p != null) {
                s += " props{contentType=" + p.getContentType() + ", deliveryMode=" + p.getDeliveryMode()
                        + ", priority=" + p.getPriority() + ", expiration=" + p.getExpiration()
                        + ", headers=" + (p.getHeaders() == null ? null : new TreeSet<>(p.getHeaders().keySet())) + "}";
            }
        }
        return s;
    }

    @BeforeEach
    void openJms() throws Exception {
        jms = jmsFactory().createConnection();
        jms.start();
    }

    @AfterEach
    void closeJms() throws Exception {
        if (jms != null) {
            jms.close();
        }
    }

    @AfterAll
    static void writeMethodLog() throws IOException {
        Path out = Path.of("target", "jms-amqp-methods.txt");
        Files.createDirectories(out.getParent());
        Files.write(out, new ArrayList<>(METHODS_SEEN), StandardCharsets.UTF_8);
    }

    private Queue jmsQueue(Session s, String prefix) throws Exception {
        return s.createQueue(queueName(prefix)); // the JMS queue is an AMQP queue of the same name
    }

    @Test
    void textMessageIsReceivedInAutoAcknowledgeSession() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-text");
        MessageConsumer consumer = s.createConsumer(q);
        s.createProducer(q).send(s.createTextMessage("hello jms"));
        Message m = consumer.receive(RECEIVE_MS);
        assertInstanceOf(TextMessage.class, m);
        assertEquals("hello jms", ((TextMessage) m).getText());
        assertFalse(m.getJMSRedelivered());
        assertNotNull(m.getJMSMessageID());
        assertEquals(q.getQueueName(), ((Queue) m.getJMSDestination()).getQueueName());
        assertNull(consumer.receive(200), "auto-acknowledged: nothing else there");
    }

    @Test
    void bytesMessageRoundTrips() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-bytes");
        BytesMessage out = s.createBytesMessage();
        byte[] payload = {0, 1, 2, 3, (byte) 0xfe, (byte) 0xff};
        out.writeBytes(payload);
        out.writeInt(42);
        out.writeUTF("tail");
        s.createProducer(q).send(out);
        BytesMessage in = (BytesMessage) s.createConsumer(q).receive(RECEIVE_MS);
        assertNotNull(in);
        byte[] got = new byte[payload.length];
        assertEquals(payload.length, in.readBytes(got));
        assertArrayEquals(payload, got);
        assertEquals(42, in.readInt());
        assertEquals("tail", in.readUTF());
    }

    @Test
    void mapMessageRoundTrips() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-map");
        MapMessage out = s.createMapMessage();
        out.setString("name", "lepus");
        out.setInt("count", 3);
        out.setBoolean("ok", true);
        out.setDouble("ratio", 0.5);
        out.setBytes("raw", new byte[] {9, 8, 7});
        s.createProducer(q).send(out);
        MapMessage in = (MapMessage) s.createConsumer(q).receive(RECEIVE_MS);
        assertNotNull(in);
        assertEquals("lepus", in.getString("name"));
        assertEquals(3, in.getInt("count"));
        assertTrue(in.getBoolean("ok"));
        assertEquals(0.5, in.getDouble("ratio"));
        assertArrayEquals(new byte[] {9, 8, 7}, in.getBytes("raw"));
    }

    @Test
    void clientAcknowledgeRedeliversUnacknowledgedMessages() throws Exception {
        Session producerSession = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(producerSession, "jms-client-ack");
        producerSession.createProducer(q).send(producerSession.createTextMessage("ack me"));

        Session s1 = jms.createSession(false, Session.CLIENT_ACKNOWLEDGE);
        Message first = s1.createConsumer(q).receive(RECEIVE_MS);
        assertEquals("ack me", ((TextMessage) first).getText());
        assertFalse(first.getJMSRedelivered());
        s1.close(); // not acknowledged: goes back to the queue

        Session s2 = jms.createSession(false, Session.CLIENT_ACKNOWLEDGE);
        MessageConsumer c2 = s2.createConsumer(q);
        Message again = c2.receive(RECEIVE_MS);
        assertNotNull(again);
        assertEquals("ack me", ((TextMessage) again).getText());
        assertTrue(again.getJMSRedelivered());
        again.acknowledge();
        s2.close();

        MessageConsumer c3 = jms.createSession(false, Session.CLIENT_ACKNOWLEDGE).createConsumer(q);
        assertNull(c3.receive(300), "acknowledged messages are gone");
    }

    @Test
    void transactedSessionCommitAndRollback() throws Exception {
        Session tx = jms.createSession(true, Session.SESSION_TRANSACTED);
        Queue q = jmsQueue(tx, "jms-tx");
        MessageProducer producer = tx.createProducer(q);
        MessageConsumer consumer = jms.createSession(false, Session.AUTO_ACKNOWLEDGE).createConsumer(q);

        producer.send(tx.createTextMessage("rolled back"));
        tx.rollback();
        producer.send(tx.createTextMessage("committed"));
        assertNull(consumer.receive(300), "nothing visible before commit");
        tx.commit();
        assertEquals("committed", ((TextMessage) consumer.receive(RECEIVE_MS)).getText());
        assertNull(consumer.receive(300), "the rolled-back send never arrives");
        consumer.close();

        // receiving in a transaction: rollback puts the message back, commit consumes it
        producer.send(tx.createTextMessage("consume in tx"));
        tx.commit();
        Session rx = jms.createSession(true, Session.SESSION_TRANSACTED);
        MessageConsumer txConsumer = rx.createConsumer(q);
        Message m = txConsumer.receive(RECEIVE_MS);
        assertEquals("consume in tx", ((TextMessage) m).getText());
        rx.rollback();
        Message again = txConsumer.receive(RECEIVE_MS);
        assertNotNull(again, "a rolled-back receive is redelivered");
        assertEquals("consume in tx", ((TextMessage) again).getText());
        assertTrue(again.getJMSRedelivered());
        rx.commit();
        rx.close();
        assertNull(jms.createSession(false, Session.AUTO_ACKNOWLEDGE).createConsumer(q).receive(300));
    }

    @Test
    void jmsPropertiesAndHeadersRoundTrip() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-props");
        TextMessage out = s.createTextMessage("with properties");
        out.setStringProperty("color", "blue");
        out.setIntProperty("size", 42);
        out.setBooleanProperty("fragile", true);
        out.setLongProperty("big", 1L << 40);
        out.setDoubleProperty("weight", 1.25);
        out.setJMSCorrelationID("corr-123");
        out.setJMSType("order");
        MessageProducer producer = s.createProducer(q);
        producer.send(out, DeliveryMode.PERSISTENT, 7, 0);

        Message in = s.createConsumer(q).receive(RECEIVE_MS);
        assertNotNull(in);
        assertEquals("blue", in.getStringProperty("color"));
        assertEquals(42, in.getIntProperty("size"));
        assertTrue(in.getBooleanProperty("fragile"));
        assertEquals(1L << 40, in.getLongProperty("big"));
        assertEquals(1.25, in.getDoubleProperty("weight"));
        assertEquals("corr-123", in.getJMSCorrelationID());
        assertEquals("order", in.getJMSType());
        assertEquals(7, in.getJMSPriority());
        assertEquals(DeliveryMode.PERSISTENT, in.getJMSDeliveryMode());
        assertEquals(out.getJMSMessageID(), in.getJMSMessageID());
    }

    @Test
    void topicDeliversToEverySubscriber() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Topic topic = s.createTopic(Broker.unique("jms-topic"));
        MessageConsumer sub1 = s.createConsumer(topic);
        MessageConsumer sub2 = jms.createSession(false, Session.AUTO_ACKNOWLEDGE).createConsumer(topic);
        s.createProducer(topic).send(s.createTextMessage("news"));
        assertEquals("news", ((TextMessage) sub1.receive(RECEIVE_MS)).getText());
        assertEquals("news", ((TextMessage) sub2.receive(RECEIVE_MS)).getText());
        assertNull(sub1.receive(200));
    }

    @Test
    void topicSubscriberOnlySeesMessagesPublishedAfterItSubscribed() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Topic topic = s.createTopic(Broker.unique("jms-topic-late"));
        MessageProducer producer = s.createProducer(topic);
        producer.send(s.createTextMessage("nobody listening"));
        MessageConsumer late = s.createConsumer(topic);
        producer.send(s.createTextMessage("after subscribe"));
        assertEquals("after subscribe", ((TextMessage) late.receive(RECEIVE_MS)).getText());
    }

    @Test
    void durableSubscriberReceivesMessagesPublishedWhileOffline() throws Exception {
        String subscription = Broker.unique("durable-sub");
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Topic topic = s.createTopic(Broker.unique("jms-durable-topic"));
        TopicSubscriber sub = s.createDurableSubscriber(topic, subscription);
        MessageProducer producer = s.createProducer(topic);
        producer.send(s.createTextMessage("online"));
        assertEquals("online", ((TextMessage) sub.receive(RECEIVE_MS)).getText());
        sub.close();

        producer.send(s.createTextMessage("while offline"));
        TopicSubscriber back = s.createDurableSubscriber(topic, subscription);
        assertEquals("while offline", ((TextMessage) back.receive(RECEIVE_MS)).getText());
        back.close();
        s.unsubscribe(subscription);
        track(subscription);
    }

    @Test
    void queueBrowserSeesMessagesWithoutConsumingThem() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-browse");
        MessageProducer producer = s.createProducer(q);
        for (String b : List.of("b0", "b1", "b2")) {
            producer.send(s.createTextMessage(b));
        }
        // the sends are asynchronous publishes: wait until the queue holds all three
        long deadline = System.currentTimeMillis() + Broker.TIMEOUT_MS;
        while (ch.queueDeclarePassive(q.getQueueName()).getMessageCount() < 3 && System.currentTimeMillis() < deadline) {
            Thread.sleep(10);
        }
        QueueBrowser browser = s.createBrowser(q);
        List<String> seen = new ArrayList<>();
        for (Enumeration<?> e = browser.getEnumeration(); e.hasMoreElements(); ) {
            seen.add(((TextMessage) e.nextElement()).getText());
        }
        browser.close();
        assertEquals(List.of("b0", "b1", "b2"), seen);
        MessageConsumer consumer = s.createConsumer(q);
        for (String b : List.of("b0", "b1", "b2")) {
            assertEquals(b, ((TextMessage) consumer.receive(RECEIVE_MS)).getText(), "browsing consumed nothing");
        }
    }

    @Test
    void messageListenerReceivesAsynchronously() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-listener");
        BlockingQueue<String> got = new LinkedBlockingQueue<>();
        s.createConsumer(q).setMessageListener(m -> {
            try {
                got.add(((TextMessage) m).getText());
            } catch (Exception e) {
                got.add("error: " + e);
            }
        });
        MessageProducer producer = jms.createSession(false, Session.AUTO_ACKNOWLEDGE).createProducer(q);
        Session ps = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        for (int i = 0; i < 3; i++) {
            producer.send(ps.createTextMessage("l" + i));
        }
        for (int i = 0; i < 3; i++) {
            assertEquals("l" + i, got.poll(RECEIVE_MS, TimeUnit.MILLISECONDS));
        }
    }

    @Test
    void requestReplyThroughTemporaryQueue() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue requests = jmsQueue(s, "jms-requests");
        // responder
        Session rs = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        MessageProducer replier = rs.createProducer(null);
        rs.createConsumer(requests).setMessageListener(m -> {
            try {
                TextMessage reply = rs.createTextMessage(((TextMessage) m).getText().toUpperCase());
                reply.setJMSCorrelationID(m.getJMSCorrelationID());
                replier.send(m.getJMSReplyTo(), reply);
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        });
        // requester
        TemporaryQueue replyTo = s.createTemporaryQueue();
        MessageConsumer replies = s.createConsumer(replyTo);
        TextMessage request = s.createTextMessage("ping");
        request.setJMSReplyTo(replyTo);
        request.setJMSCorrelationID("req-1");
        s.createProducer(requests).send(request);
        TextMessage reply = (TextMessage) replies.receive(RECEIVE_MS);
        assertNotNull(reply);
        assertEquals("PING", reply.getText());
        assertEquals("req-1", reply.getJMSCorrelationID());
        replies.close();
        replyTo.delete();
    }

    @Test
    void receiveOnEmptyQueueTimesOutWithNull() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        MessageConsumer consumer = s.createConsumer(jmsQueue(s, "jms-empty"));
        long start = System.nanoTime();
        assertNull(consumer.receive(300));
        assertTrue(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) >= 250);
        assertNull(consumer.receiveNoWait());
    }

    @Test
    void jmsQueueIsAnAmqpQueueCarryingJmsHeaders() throws Exception {
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = jmsQueue(s, "jms-to-amqp");
        TextMessage m = s.createTextMessage("cross-client");
        m.setStringProperty("color", "red");
        s.createProducer(q).send(m);
        com.rabbitmq.client.GetResponse r = Broker.getWithin(ch, q.getQueueName(), true);
        assertEquals("jms.durable.queues", r.getEnvelope().getExchange());
        assertEquals(q.getQueueName(), r.getEnvelope().getRoutingKey());
        Map<String, Object> headers = r.getProps().getHeaders();
        assertEquals(m.getJMSMessageID(), headers.get("JMSMessageID").toString());
        assertEquals("red", headers.get("color").toString());
        assertEquals(2, r.getProps().getDeliveryMode());
        assertEquals(4, r.getProps().getPriority(), "JMS default priority");
    }

    @Test
    void jmsSendToAmqpDestinationArrivesAsPlainAmqpMessage() throws Exception {
        String q = declareQueue("amqp-dest-out");
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        RMQDestination dest = new RMQDestination("amqp-out", "", q, q); // exchange "", routing key = queue
        TextMessage m = s.createTextMessage("plain text for AMQP");
        m.setStringProperty("origin", "jms");
        m.setJMSCorrelationID("c-9");
        s.createProducer(dest).send(m);
        com.rabbitmq.client.GetResponse r = Broker.getWithin(ch, q, true);
        assertEquals("plain text for AMQP", Broker.body(r));
        assertEquals("c-9", r.getProps().getCorrelationId());
        assertEquals("jms", r.getProps().getHeaders().get("origin").toString());
    }

    @Test
    void amqpPublishIsReceivedByJmsConsumerOfAmqpDestination() throws Exception {
        String q = declareQueue("amqp-dest-in");
        Session s = jms.createSession(false, Session.AUTO_ACKNOWLEDGE);
        RMQDestination dest = new RMQDestination("amqp-in", "", q, q);
        MessageConsumer consumer = s.createConsumer(dest);
        ch.basicPublish("", q, new AMQP.BasicProperties.Builder()
                .headers(Map.of("origin", "amqp", "n", 5)).correlationId("c-1").build(),
                Broker.bytes("bytes from AMQP"));
        Message in = consumer.receive(RECEIVE_MS);
        assertInstanceOf(BytesMessage.class, in);
        BytesMessage bm = (BytesMessage) in;
        byte[] body = new byte[(int) bm.getBodyLength()];
        bm.readBytes(body);
        assertEquals("bytes from AMQP", new String(body, StandardCharsets.UTF_8));
        assertEquals("amqp", in.getStringProperty("origin"));
        assertEquals(5, in.getIntProperty("n"));
        assertEquals("c-1", in.getJMSCorrelationID());
    }
}
