"""What runs inside Flower: the ServerApp and ClientApp, the Messenger and its grids, the journal,
client state, reply validators, faults and seeding."""
