package lepus.interop;

import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;

/**
 * Base class: one connection and channel per test; queues and exchanges created through
 * {@link #queueName} / {@link #exchangeName} are deleted afterwards, even when the test broke the channel.
 */
public abstract class BrokerTest {

    protected Connection conn;
    protected Channel ch;
    private final List<String> queues = new ArrayList<>();
    private final List<String> exchanges = new ArrayList<>();
    private final List<Connection> extraConnections = new ArrayList<>();

    @BeforeEach
    void openConnection() throws Exception {
        conn = Broker.connect();
        ch = conn.createChannel();
    }

    @AfterEach
    void cleanUp() throws Exception {
        for (Connection c : extraConnections) {
            closeQuietly(c);
        }
        try (Connection c = Broker.connect()) {
            Channel cleanup = c.createChannel();
            for (String q : queues) {
                try {
                    cleanup.queueDelete(q);
                } catch (Exception e) {
                    cleanup = c.createChannel();
                }
            }
            for (String x : exchanges) {
                try {
                    cleanup.exchangeDelete(x);
                } catch (Exception e) {
                    cleanup = c.createChannel();
                }
            }
        } finally {
            closeQuietly(conn);
        }
    }

    protected String queueName(String prefix) {
        String q = Broker.unique(prefix);
        queues.add(q);
        return q;
    }

    protected String exchangeName(String prefix) {
        String x = Broker.unique(prefix);
        exchanges.add(x);
        return x;
    }

    /** Registers a broker-named queue (or any other name) for cleanup. */
    protected String track(String queue) {
        queues.add(queue);
        return queue;
    }

    /** Declares a fresh non-durable queue, registered for cleanup. */
    protected String declareQueue(String prefix) throws Exception {
        String q = queueName(prefix);
        ch.queueDeclare(q, false, false, false, null);
        return q;
    }

    /**
     * Publishes to a queue through the default exchange on a confirm channel and waits for the confirms,
     * so the messages are known to be enqueued (RabbitMQ's message counts are not updated synchronously
     * with a publish on another channel, nor even on the same channel).
     */
    protected void publishConfirmed(String queue, String... bodies) throws Exception {
        Channel confirmCh = conn.createChannel();
        confirmCh.confirmSelect();
        for (String b : bodies) {
            confirmCh.basicPublish("", queue, null, Broker.bytes(b));
        }
        confirmCh.waitForConfirmsOrDie(Broker.TIMEOUT_MS);
        confirmCh.close();
    }

    /** A second connection, closed after the test. */
    protected Connection otherConnection() throws Exception {
        Connection c = Broker.connect();
        extraConnections.add(c);
        return c;
    }

    protected static void closeQuietly(Connection c) {
        if (c != null && c.isOpen()) {
            try {
                c.close(2_000);
            } catch (Exception ignored) {
                // already closed by the broker
            }
        }
    }
}
