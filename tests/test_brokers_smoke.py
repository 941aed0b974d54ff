"""The test brokers start and move a message (guards every MQTT integration test)."""

import threading

import paho.mqtt.client as mqtt


def _roundtrip(broker, protocol):
    got = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="smoke", protocol=protocol)
    c.on_message = lambda cl, u, m: got.set() if m.payload == b"hi" else None
    c.connect("127.0.0.1", broker.port)
    c.subscribe("t/x", qos=1)
    c.loop_start()
    try:
        import time

        time.sleep(0.3)
        c.publish("t/x", b"hi", qos=1)
        assert got.wait(5)
    finally:
        c.loop_stop()
        c.disconnect()


def test_mosquitto_roundtrip(mosquitto):
    _roundtrip(mosquitto, mqtt.MQTTv5)


def test_nats_mqtt_roundtrip(nats_mqtt):
    _roundtrip(nats_mqtt, mqtt.MQTTv311)
