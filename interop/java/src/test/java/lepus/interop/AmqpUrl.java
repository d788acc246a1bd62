package lepus.interop;

import java.io.ByteArrayOutputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;

/**
 * The broker address of the suite, parsed from {@code AMQP_URL}
 * ({@code amqp://user:pass@host:port/vhost}, default {@code amqp://guest:guest@127.0.0.1:5672/}).
 * The vhost is "/" when the path is "/" or empty; user, password and vhost are percent-decoded
 * ("%2F" is a slash; '+' stays a plus, as in RFC 3986, unlike form encoding).
 */
public record AmqpUrl(String user, String password, String host, int port, String vhost) {

    public static final String DEFAULT = "amqp://guest:guest@127.0.0.1:5672/";

    public static AmqpUrl fromEnv() {
        String env = System.getenv("AMQP_URL");
        return parse(env == null || env.isBlank() ? DEFAULT : env.trim());
    }

    public static AmqpUrl parse(String url) {
        URI uri = URI.create(url);
        if (!"amqp".equalsIgnoreCase(uri.getScheme())) {
            throw new IllegalArgumentException("only amqp:// URLs are supported: " + url);
        }
        String user = "guest";
        String password = "guest";
        String userInfo = uri.getRawUserInfo();
        if (userInfo != null) {
            int colon = userInfo.indexOf(':');
            if (colon < 0) {
                user = decode(userInfo);
            } else {
                user = decode(userInfo.substring(0, colon));
                password = decode(userInfo.substring(colon + 1));
            }
        }
        String host = uri.getHost() == null ? "127.0.0.1" : uri.getHost();
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port = uri.getPort() < 0 ? 5672 : uri.getPort();
        String path = uri.getRawPath();
        String vhost = (path == null || path.isEmpty() || path.equals("/")) ? "/" : decode(path.substring(1));
        return new AmqpUrl(user, password, host, port, vhost);
    }

    private static String decode(String s) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
        for (int i = 0; i < bytes.length; i++) {
            if (bytes[i] == '%' && i + 2 < bytes.length) {
                out.write(Integer.parseInt(new String(bytes, i + 1, 2, StandardCharsets.US_ASCII), 16));
                i += 2;
            } else {
                out.write(bytes[i]);
            }
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    @Override
    public String toString() {
        return "amqp://" + user + ":***@" + host + ":" + port + "/" + (vhost.equals("/") ? "" : vhost);
    }
}
