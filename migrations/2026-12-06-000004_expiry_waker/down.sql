DROP TABLE booking_expiration_waker;
