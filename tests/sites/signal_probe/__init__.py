"""An app for the daphne processes of tests/load/test_signals_multiprocess.py: receivers of
user_online / user_offline that push what each process sent onto a Redis list, so the test
counts the signals of every process in one place."""
