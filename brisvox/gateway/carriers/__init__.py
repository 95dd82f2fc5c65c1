"""One call leg per WebSocket carrier protocol (Twilio, native, Plivo, Telnyx, Vonage, Exotel) and their shared stream session."""
