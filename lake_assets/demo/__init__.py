"""Sample vendor data for the demo and the tests."""
