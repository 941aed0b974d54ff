"""MQTT transport: topic tree (topics), paho wrapper (mqtt.MqttLink), device side (device.DeviceLink).

Importing this package is cheap: paho is imported only by agent.transport.mqtt.
"""
