"""What runs inside Flower: the ServerApp and ClientApp (with HE's layer), the Messenger and its grids,
the journal, client state, reply validators and faults."""
