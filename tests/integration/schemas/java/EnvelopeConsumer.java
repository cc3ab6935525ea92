// An outside consumer of Runlog's sealed payloads, written against the contract alone (docs/reference/
// contract.md, "The payload envelope"): the Kafka Java client reads a run's records from the events topic,
// every inline payload (a data: URI inside a record) and every stored artifact file of the subject is
// opened with the JDK's own AES/GCM/NoPadding, given the subject's raw 32-byte data key. No Runlog code.
//
// Run as a single source file (java 11+):
//   java -cp '<kafka libs>/*' EnvelopeConsumer.java BOOTSTRAP TOPIC RUN_ID DATA_KEY_HEX ARTIFACT_ROOT
// Prints one line per payload opened: "inline <plaintext>" or "stored <plaintext>".

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import javax.crypto.Cipher;
import javax.crypto.Mac;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class EnvelopeConsumer {
    static final byte[] MAGIC = {0x00, 0x52, 0x4C, 0x45, 0x01};
    static final Pattern DATA_URI = Pattern.compile("data:[^;,\"]*;base64,([A-Za-z0-9+/=]+)");

    final SecretKeySpec enc;

    EnvelopeConsumer(byte[] dataKey) throws Exception {
        // the envelope's key id (bytes 5..21) names the subject's key; an envelope of another subject
        // simply does not authenticate under this one
        this.enc = new SecretKeySpec(derive(dataKey, "runlog.v1.enc"), "AES");
    }

    static byte[] derive(byte[] key, String label) throws Exception {
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(key, "HmacSHA256"));
        return mac.doFinal(label.getBytes(StandardCharsets.US_ASCII));
    }

    /** The plaintext of an envelope, or null when it is no envelope or does not open under this key. */
    String open(byte[] env) {
        if (env.length < 5 + 16 + 12 + 16 || !Arrays.equals(Arrays.copyOf(env, 5), MAGIC)) {
            return null;
        }
        byte[] head = Arrays.copyOfRange(env, 0, 21);      // magic + key id: the associated data
        byte[] nonce = Arrays.copyOfRange(env, 21, 33);
        try {
            Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
            c.init(Cipher.DECRYPT_MODE, enc, new GCMParameterSpec(128, nonce));
            c.updateAAD(head);
            return new String(c.doFinal(env, 33, env.length - 33), StandardCharsets.UTF_8);
        } catch (Exception e) {
            return null;  // AEADBadTagException: another subject's key, or not where the payload ends
        }
    }

    /** Inline payloads of a record's bytes: each data: URI's base64 (its end found by the GCM tag). */
    List<String> inline(byte[] record) {
        List<String> out = new ArrayList<>();
        Matcher m = DATA_URI.matcher(new String(record, StandardCharsets.ISO_8859_1));
        while (m.find()) {
            String b64 = m.group(1);
            for (int end = b64.length() - b64.length() % 4; end >= 4; end -= 4) {
                String plain;
                try {
                    plain = open(Base64.getDecoder().decode(b64.substring(0, end)));
                } catch (IllegalArgumentException e) {
                    continue;
                }
                if (plain != null) {
                    out.add(plain);
                    break;
                }
            }
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], runId = args[2];
        EnvelopeConsumer consumer = new EnvelopeConsumer(HexFormat.of().parseHex(args[3]));
        Path artifacts = Path.of(args[4]);

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo info : c.partitionsFor(topic, Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(topic, info.partition()));
            }
            c.assign(parts);
            c.seekToBeginning(parts);
            Map<TopicPartition, Long> end = c.endOffsets(parts, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline
                    && parts.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    if (r.key() != null && runId.equals(new String(r.key(), StandardCharsets.UTF_8))) {
                        for (String plain : consumer.inline(r.value())) {
                            System.out.println("inline " + plain);
                        }
                    }
                }
            }
        }
        if (Files.isDirectory(artifacts)) {
            try (Stream<Path> files = Files.walk(artifacts)) {
                for (Path f : (Iterable<Path>) files.filter(Files::isRegularFile)::iterator) {
                    String plain = consumer.open(Files.readAllBytes(f));
                    if (plain != null) {
                        System.out.println("stored " + plain);
                    }
                }
            }
        }
    }
}
